// Megatron rank order tp-cp-ep-dp-pp and the folded expert grid; see rank_grid.h.
#include "core/rank_grid.h"

#include <algorithm>

namespace ptdp {

std::vector<int> RankGrid::TpGroup(int rank) const {
  RankCoord c = Coord(rank);
  std::vector<int> g;
  for (int i = 0; i < tp_; ++i) {
    c.tp = i;
    g.push_back(Rank(c));
  }
  return g;
}
std::vector<int> RankGrid::CpGroup(int rank) const {
  RankCoord c = Coord(rank);
  std::vector<int> g;
  for (int i = 0; i < cp_; ++i) {
    c.cp = i;
    g.push_back(Rank(c));
  }
  return g;
}
std::vector<int> RankGrid::DpGroup(int rank) const {
  RankCoord c = Coord(rank);
  std::vector<int> g;
  for (int i = 0; i < dp_; ++i) {
    c.dp = i;
    g.push_back(Rank(c));
  }
  return g;
}
std::vector<int> RankGrid::PpGroup(int rank) const {
  RankCoord c = Coord(rank);
  std::vector<int> g;
  for (int i = 0; i < pp_; ++i) {
    c.pp = i;
    g.push_back(Rank(c));
  }
  return g;
}
std::vector<int> RankGrid::DpCpGroup(int rank) const {
  RankCoord c = Coord(rank);
  std::vector<int> g;
  for (int i = 0; i < dp_; ++i)
    for (int j = 0; j < cp_; ++j) {
      c.dp = i;
      c.cp = j;
      g.push_back(Rank(c));
    }
  return g;
}
std::vector<int> RankGrid::TpCpGroup(int rank) const {
  RankCoord c = Coord(rank);
  std::vector<int> g;
  for (int j = 0; j < cp_; ++j)
    for (int i = 0; i < tp_; ++i) {
      c.cp = j;
      c.tp = i;
      g.push_back(Rank(c));
    }
  return g;
}

std::vector<int> RankGrid::EtpGroup(int rank) const {
  const int base = rank - rank % stage_size();
  const ExpertCoord e = Expert(rank);
  std::vector<int> g;
  for (int i = 0; i < etp_; ++i) g.push_back(base + i + etp_ * (e.ep + ep_ * e.edp));
  return g;
}
std::vector<int> RankGrid::EpGroup(int rank) const {
  const int base = rank - rank % stage_size();
  const ExpertCoord e = Expert(rank);
  std::vector<int> g;
  for (int i = 0; i < ep_; ++i) g.push_back(base + e.etp + etp_ * (i + ep_ * e.edp));
  return g;
}
std::vector<int> RankGrid::EdpGroup(int rank) const {
  const int base = rank - rank % stage_size();
  const ExpertCoord e = Expert(rank);
  std::vector<int> g;
  for (int i = 0; i < edp(); ++i) g.push_back(base + e.etp + etp_ * (e.ep + ep_ * i));
  return g;
}

std::vector<int> RankGrid::EmbeddingGroup(int rank) const {
  RankCoord c = Coord(rank);
  RankCoord first = c, last = c;
  first.pp = 0;
  last.pp = pp_ - 1;
  if (pp_ == 1) return {Rank(first)};
  return {Rank(first), Rank(last)};
}

template <typename F>
std::vector<std::vector<int>> RankGrid::All(F of) const {
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world(); ++r) {
    std::vector<int> g = of(r);
    if (*std::min_element(g.begin(), g.end()) == r) out.push_back(std::move(g));
  }
  return out;
}

std::vector<std::vector<int>> RankGrid::AllTpGroups() const {
  return All([&](int r) { return TpGroup(r); });
}
std::vector<std::vector<int>> RankGrid::AllCpGroups() const {
  return All([&](int r) { return CpGroup(r); });
}
std::vector<std::vector<int>> RankGrid::AllDpGroups() const {
  return All([&](int r) { return DpGroup(r); });
}
std::vector<std::vector<int>> RankGrid::AllPpGroups() const {
  return All([&](int r) { return PpGroup(r); });
}
std::vector<std::vector<int>> RankGrid::AllDpCpGroups() const {
  return All([&](int r) { return DpCpGroup(r); });
}
std::vector<std::vector<int>> RankGrid::AllTpCpGroups() const {
  return All([&](int r) { return TpCpGroup(r); });
}
std::vector<std::vector<int>> RankGrid::AllEtpGroups() const {
  return All([&](int r) { return EtpGroup(r); });
}
std::vector<std::vector<int>> RankGrid::AllEpGroups() const {
  return All([&](int r) { return EpGroup(r); });
}
std::vector<std::vector<int>> RankGrid::AllEdpGroups() const {
  return All([&](int r) { return EdpGroup(r); });
}

}  // namespace ptdp
