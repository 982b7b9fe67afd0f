// `wsyncctl catalog`: the TransferSpec JSON of a catalog case, or the model list.
#include <cstdio>
#include <fstream>
#include <iostream>

#include "absl/strings/str_format.h"
#include "catalog/model_config.h"
#include "common/logging.h"
#include "tools/args.h"
#include "tools/case_flags.h"
#include "tools/spec_io.h"
#include "tools/subcommands.h"

namespace wsync::tools {
namespace {

void CatalogUsage(FILE* out) {
  std::fprintf(out,
               "usage: wsyncctl catalog --model M --source S --destination D [case flags] "
               "[--out FILE] [--pretty]\n"
               "       wsyncctl catalog --list\n\ncase flags:\n%s",
               CaseFlagsUsage().c_str());
}

void ListModels() {
  std::printf("%-18s %16s %10s %10s  %s\n", "model", "parameters", "bf16 GB", "tensors", "source");
  for (const catalog::ModelConfig& m : catalog::AllModels()) {
    const int64_t params = catalog::ParameterCount(m);
    const size_t tensors = catalog::ModelTensors(m, catalog::ExpertStyle::kSeparate).size();
    std::printf("%-18s %16lld %10.2f %10zu  %s\n", m.name.c_str(), static_cast<long long>(params),
                params * 2 / 1e9, tensors, m.source.c_str());
  }
}

}  // namespace

int RunCatalogCommand(const std::vector<std::string>& argv) {
  FlagSpec spec{{"out"}, {"list", "pretty", "help"}};
  AddCaseFlags(&spec);
  auto args = ParseArgs(argv, spec);
  if (!args.ok()) {
    spdlog::error("catalog: {}", std::string(args.status().message()));
    CatalogUsage(stderr);
    return kExitUsage;
  }
  if (args->Has("help")) {
    CatalogUsage(stdout);
    return kExitOk;
  }
  if (!args->positional().empty()) {
    spdlog::error("catalog: unexpected argument '{}'", args->positional()[0]);
    return kExitUsage;
  }
  if (args->Has("list")) {
    ListModels();
    return kExitOk;
  }
  auto transfer = SpecFromCaseFlags(*args);
  if (!transfer.ok()) {
    spdlog::error("catalog: {}", std::string(transfer.status().message()));
    return kExitUsage;
  }
  auto json = ToJson(*transfer, args->Has("pretty"));
  if (!json.ok()) {
    spdlog::error("catalog: {}", std::string(json.status().message()));
    return kExitFailed;
  }
  if (args->Has("out")) {
    std::ofstream out(args->Value("out"), std::ios::binary);
    out << *json << "\n";
    if (!out.good()) {
      spdlog::error("catalog: cannot write '{}'", args->Value("out"));
      return kExitFailed;
    }
    return kExitOk;
  }
  std::cout << *json << "\n";
  return std::cout.good() ? kExitOk : kExitFailed;
}

}  // namespace wsync::tools
