// RankGrid: Megatron's rank order "tp-dp-pp" (TP innermost, PP outermost):
//   global_rank = tp_idx + t * (dp_idx + d * pp_idx)
// Example, world 16, t=2, p=4, d=2 (megatron/core/parallel_state.py RankGenerator):
//   TP [0,1] [2,3] ...   DP [0,2] [1,3] [4,6] ...   PP [0,4,8,12] [1,5,9,13] ...
//   pp stage:   0          1          2           3
//            [0 1|2 3]  [4 5|6 7]  [8 9|10 11] [12 13|14 15]   (| separates DP replicas)
#pragma once

#include <vector>

namespace ptdp {

struct RankCoord {
  int tp = 0;  // index inside the TP group
  int dp = 0;  // index inside the DP group
  int pp = 0;  // pipeline stage
};

class RankGrid {
 public:
  // Precondition: t, d, p > 0.
  RankGrid(int tp, int dp, int pp) : tp_(tp), dp_(dp), pp_(pp) {}

  int world() const { return tp_ * dp_ * pp_; }
  int tp() const { return tp_; }
  int dp() const { return dp_; }
  int pp() const { return pp_; }

  int Rank(RankCoord c) const { return c.tp + tp_ * (c.dp + dp_ * c.pp); }
  RankCoord Coord(int rank) const {
    return {rank % tp_, (rank / tp_) % dp_, rank / (tp_ * dp_)};
  }

  // The ranks of each group containing `rank`, in group order (index = coordinate).
  std::vector<int> TpGroup(int rank) const;
  std::vector<int> DpGroup(int rank) const;
  std::vector<int> PpGroup(int rank) const;
  // First and last stage of rank's pipeline (one rank if p == 1): the tied-embedding group.
  std::vector<int> EmbeddingGroup(int rank) const;

  // Every group of a kind, each once, ordered by their first rank.
  std::vector<std::vector<int>> AllTpGroups() const;
  std::vector<std::vector<int>> AllDpGroups() const;
  std::vector<std::vector<int>> AllPpGroups() const;

 private:
  int tp_, dp_, pp_;
};

}  // namespace ptdp
