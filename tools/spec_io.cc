#include "tools/spec_io.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/strict_json.h"
#include "google/protobuf/util/json_util.h"

namespace wsync::tools {

absl::StatusOr<v1::TransferSpec> ReadSpecFile(const std::string& path) {
  std::stringstream text;
  if (path == "-") {
    text << std::cin.rdbuf();
  } else {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      return absl::NotFoundError(
          absl::StrCat("cannot read spec '", path, "': ", std::strerror(errno)));
    }
    text << in.rdbuf();
  }
  const std::string json = text.str();
  if (json.find_first_not_of(" \t\r\n") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("spec '", path, "' is empty"));
  }
  absl::Status strict =
      CheckStrictJson(json, *v1::TransferSpec::descriptor(),
                      absl::StrCat("spec '", path, "' is not a valid TransferSpec JSON"));
  if (!strict.ok()) return strict;
  v1::TransferSpec spec;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto status = google::protobuf::util::JsonStringToMessage(json, &spec, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec '", path, "' is not a valid TransferSpec JSON: ", status.message().as_string()));
  }
  return spec;
}

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message, bool pretty) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = pretty;
  // Outside replayers should not need to know proto3 defaults.
  options.always_print_primitive_fields = true;
  std::string out;
  auto status = google::protobuf::util::MessageToJsonString(message, &out, options);
  if (!status.ok()) {
    return absl::InternalError(
        absl::StrCat("JSON encoding failed: ", status.message().as_string()));
  }
  return out;
}

}  // namespace wsync::tools
