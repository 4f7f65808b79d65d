// Stand-ins for lib/ptdp/libptdp_cuda.so that the loader (cli/cuda_module.h) must refuse, each
// built as its own shared object from this file (tests/cli/CMakeLists.txt):
//   PTDP_FAKE_OTHER_ABI:    the entry point, but from "other sources" (another fingerprint);
//   PTDP_FAKE_NO_ENTRY:     a shared object without the entry point;
//   PTDP_FAKE_MISSING_DEP:  the entry point, but linked against PTDP_FAKE_DEP's library, which is
//                           not on the loader's path, so dlopen fails naming it;
//   PTDP_FAKE_DEP:          that library.
#if PTDP_FAKE_DEP
extern "C" int ptdp_fake_dep() { return 1; }
#elif PTDP_FAKE_NO_ENTRY
extern "C" int ptdp_fake_not_a_module() { return 1; }
#else
#if PTDP_FAKE_MISSING_DEP
extern "C" int ptdp_fake_dep();
#endif

namespace ptdp::rt::cuda {
class CudaModule;
}

extern "C" ptdp::rt::cuda::CudaModule* ptdp_cuda_module(const char*, const char** module_abi) {
#if PTDP_FAKE_MISSING_DEP
  (void)ptdp_fake_dep();
#endif
  *module_abi = "0123456789abcdef";
  return nullptr;
}
#endif
