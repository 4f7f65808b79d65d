// The ptdp command table: each command registers its flags on a CLI11 sub-app and returns a
// function to run after parsing. Exit codes: 0 ok, 1 error (message on stderr), 2 usage.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace ptdp::cli {

using Runner = std::function<int()>;

struct Command {
  const char* name;
  const char* help;     // one line
  const char* example;  // shown in --help: whole command lines, one per line
  Runner (*setup)(CLI::App* sub);
};

Runner SetupPlan(CLI::App* sub);
Runner SetupSchedule(CLI::App* sub);
Runner SetupSimulate(CLI::App* sub);
Runner SetupTopo(CLI::App* sub);
Runner SetupValidate(CLI::App* sub);
Runner SetupReport(CLI::App* sub);
Runner SetupTrain(CLI::App* sub);
Runner SetupInfo(CLI::App* sub);
Runner SetupCalibrate(CLI::App* sub);
Runner SetupCompare(CLI::App* sub);
Runner SetupCheckpoint(CLI::App* sub);

// Prints "ptdp: <message>" on stderr and returns 1.
int Fail(const std::string& message);

}  // namespace ptdp::cli
