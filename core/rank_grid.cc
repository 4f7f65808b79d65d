// Megatron rank order tp-dp-pp; see rank_grid.h.
#include "core/rank_grid.h"

namespace ptdp {

std::vector<int> RankGrid::TpGroup(int rank) const {
  RankCoord c = Coord(rank);
  std::vector<int> g;
  for (int i = 0; i < tp_; ++i) g.push_back(Rank({i, c.dp, c.pp}));
  return g;
}
std::vector<int> RankGrid::DpGroup(int rank) const {
  RankCoord c = Coord(rank);
  std::vector<int> g;
  for (int i = 0; i < dp_; ++i) g.push_back(Rank({c.tp, i, c.pp}));
  return g;
}
std::vector<int> RankGrid::PpGroup(int rank) const {
  RankCoord c = Coord(rank);
  std::vector<int> g;
  for (int i = 0; i < pp_; ++i) g.push_back(Rank({c.tp, c.dp, i}));
  return g;
}
std::vector<int> RankGrid::EmbeddingGroup(int rank) const {
  RankCoord c = Coord(rank);
  if (pp_ == 1) return {Rank({c.tp, c.dp, 0})};
  return {Rank({c.tp, c.dp, 0}), Rank({c.tp, c.dp, pp_ - 1})};
}

std::vector<std::vector<int>> RankGrid::AllTpGroups() const {
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world(); ++r)
    if (Coord(r).tp == 0) out.push_back(TpGroup(r));
  return out;
}
std::vector<std::vector<int>> RankGrid::AllDpGroups() const {
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world(); ++r)
    if (Coord(r).dp == 0) out.push_back(DpGroup(r));
  return out;
}
std::vector<std::vector<int>> RankGrid::AllPpGroups() const {
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world(); ++r)
    if (Coord(r).pp == 0) out.push_back(PpGroup(r));
  return out;
}

}  // namespace ptdp
