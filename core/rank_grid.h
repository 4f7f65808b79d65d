// RankGrid: Megatron's rank order "tp-cp-ep-dp-pp" (TP innermost, PP outermost) for the dense
// (attention) grid, and the expert grid that folds over the same ranks (MoE parallel folding).
// Dense grid (megatron/core/parallel_state.py, RankGenerator with ep = 1):
//   global_rank = tp_idx + t * (cp_idx + c * (dp_idx + d * pp_idx))
// Example, world 16, t=2, c=1, p=4, d=2:
//   TP [0,1] [2,3] ...   DP [0,2] [1,3] [4,6] ...   PP [0,4,8,12] [1,5,9,13] ...
//   pp stage:   0          1          2           3
//            [0 1|2 3]  [4 5|6 7]  [8 9|10 11] [12 13|14 15]   (| separates DP replicas)
// With c=2, t=2, d=1: CP groups [0,2] [1,3]; the gradient group of a parameter replicated over
// DP and CP (Megatron's "dp-cp" group) is every rank with the same tp and pp index.
// Expert grid (parallel_state.py's expert RankGenerator, order tp-ep-dp-pp, etp = expert TP,
// ep = expert parallel, edp = t*c*d / (etp*ep) expert data parallel), over the same pipeline
// stages: with q = global_rank mod (t*c*d) the rank's index inside its stage,
//   q = etp_idx + etp * (ep_idx + ep * edp_idx)
// Example t=2, c=1, d=2, etp=1, ep=2 (edp 2): EP [0,1] [2,3], expert DP [0,2] [1,3].
#pragma once

#include <vector>

namespace ptdp {

struct RankCoord {
  int tp = 0;  // index inside the TP group
  int dp = 0;  // index inside the DP group
  int pp = 0;  // pipeline stage
  int cp = 0;  // index inside the CP group
};

// A rank's place in the expert grid.
struct ExpertCoord {
  int etp = 0;  // index inside the expert-TP group
  int ep = 0;   // index inside the EP group: holds experts [ep * E/ep, (ep + 1) * E/ep)
  int edp = 0;  // index inside the expert-DP group
};

class RankGrid {
 public:
  // Precondition: t, d, p > 0 (cp 1, no experts: the expert grid is etp 1, ep 1, edp = t*d).
  RankGrid(int tp, int dp, int pp) : RankGrid(tp, 1, dp, pp, 1, 1) {}
  // Precondition: every size > 0 and etp * ep divides tp * cp * dp (CheckLayout's
  // expert_grid_does_not_fold).
  RankGrid(int tp, int cp, int dp, int pp, int etp, int ep)
      : tp_(tp), cp_(cp), dp_(dp), pp_(pp), etp_(etp), ep_(ep) {}
  int world() const { return tp_ * cp_ * dp_ * pp_; }
  int tp() const { return tp_; }
  int cp() const { return cp_; }
  int dp() const { return dp_; }
  int pp() const { return pp_; }
  int etp() const { return etp_; }
  int ep() const { return ep_; }
  int edp() const { return stage_size() / (etp_ * ep_); }
  int stage_size() const { return tp_ * cp_ * dp_; }  // ranks of one pipeline stage
  int Rank(RankCoord c) const { return c.tp + tp_ * (c.cp + cp_ * (c.dp + dp_ * c.pp)); }
  RankCoord Coord(int rank) const {
    RankCoord c;
    c.tp = rank % tp_;
    c.cp = (rank / tp_) % cp_;
    c.dp = (rank / (tp_ * cp_)) % dp_;
    c.pp = rank / stage_size();
    return c;
  }
  ExpertCoord Expert(int rank) const {
    const int q = rank % stage_size();
    return {q % etp_, (q / etp_) % ep_, q / (etp_ * ep_)};
  }

  // The ranks of each group containing `rank`, in group order (index = coordinate).
  std::vector<int> TpGroup(int rank) const;
  std::vector<int> CpGroup(int rank) const;
  std::vector<int> DpGroup(int rank) const;
  std::vector<int> PpGroup(int rank) const;
  // Same tp and pp index: the ranks over which a dense parameter's gradient is reduced (DP x
  // CP, ordered by dp then cp, i.e. ascending global rank). Equals DpGroup when cp == 1.
  std::vector<int> DpCpGroup(int rank) const;
  // Same dp and pp index: the ranks that split one DP replica's sequences (TP x CP).
  std::vector<int> TpCpGroup(int rank) const;
  // Expert grid groups (same pipeline stage).
  std::vector<int> EtpGroup(int rank) const;
  std::vector<int> EpGroup(int rank) const;
  std::vector<int> EdpGroup(int rank) const;
  // First and last stage of rank's pipeline (one rank if p == 1): the tied-embedding group.
  std::vector<int> EmbeddingGroup(int rank) const;
  // Every group of a kind, each once, ordered by their first rank.
  std::vector<std::vector<int>> AllTpGroups() const;
  std::vector<std::vector<int>> AllCpGroups() const;
  std::vector<std::vector<int>> AllDpGroups() const;
  std::vector<std::vector<int>> AllPpGroups() const;
  std::vector<std::vector<int>> AllDpCpGroups() const;
  std::vector<std::vector<int>> AllTpCpGroups() const;
  std::vector<std::vector<int>> AllEtpGroups() const;
  std::vector<std::vector<int>> AllEpGroups() const;
  std::vector<std::vector<int>> AllEdpGroups() const;

 private:
  // Every rank's group by `of`, each group once (in order of its lowest rank).
  template <typename F>
  std::vector<std::vector<int>> All(F of) const;
  int tp_, cp_, dp_, pp_, etp_, ep_;
};

}  // namespace ptdp
