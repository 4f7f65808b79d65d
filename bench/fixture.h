// A model on a shipped cluster file, loaded once per benchmark binary.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "bench/shipped.h"
#include "core/model.h"
#include "cost_model/analytic.h"
#include "topology/cluster.h"
#include "topology/topology.h"

namespace ptdp::bench {

struct Fixture {
  ClusterSpec cluster;
  ModelSpec model;
  std::unique_ptr<Topology> topo;
  std::unique_ptr<AnalyticModel> cost;
  // configs/clusters/<cluster_file> resized to `nodes`, configs/models/<model_file>; exits on
  // a load error (a benchmark has no one to return it to).
  Fixture(const std::string& cluster_file, const std::string& model_file, int nodes) {
    auto c = LoadClusterFile(bench::Shipped("configs/clusters/" + cluster_file));
    auto m = LoadModelFile(bench::Shipped("configs/models/" + model_file));
    if (!c.ok() || !m.ok()) {
      std::fprintf(stderr, "bench: %s %s\n", c.status().message().c_str(),
                   m.status().message().c_str());
      std::exit(1);
    }
    cluster = *c;
    cluster.nodes = nodes;
    model = *m;
    topo = std::make_unique<Topology>(*Topology::Build(cluster));
    cost = std::make_unique<AnalyticModel>(*AnalyticModel::Create(model, *topo));
  }
};

}  // namespace ptdp::bench
