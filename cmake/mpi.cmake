# Finds MPI (OpenMPI from Debian: libopenmpi-dev, openmpi-bin), an optional dependency of the
# CUDA runtime: with it, several processes (mpirun, srun) share rank 0's NCCL id
# (runtime/cuda/mpi_bootstrap.h). Sets PTDP_HAVE_MPI ON when found; OFF skips nothing else.
set(PTDP_HAVE_MPI OFF)
if(PTDP_HAVE_CUDA)
  find_package(MPI COMPONENTS CXX QUIET)
  if(MPI_CXX_FOUND)
    set(PTDP_HAVE_MPI ON)
    message(STATUS "ptdp: MPI bootstrap built (${MPI_CXX_LIBRARIES})")
  else()
    message(STATUS "ptdp: MPI bootstrap not built (MPI not found; apt install libopenmpi-dev)")
  endif()
endif()
