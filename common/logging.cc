#include "common/logging.h"

#include <cstdlib>
#include <memory>
#include <string>

#include "spdlog/sinks/stdout_sinks.h"

namespace wsync {

void InitLogging(std::string_view program) {
  auto logger = std::make_shared<spdlog::logger>(std::string(program),
                                                 std::make_shared<spdlog::sinks::stderr_sink_mt>());
  // UTC timestamps with milliseconds, one-letter level, program[pid].
  logger->set_pattern(std::string("%Y-%m-%dT%H:%M:%S.%eZ %L ") + std::string(program) + "[%P] %v",
                      spdlog::pattern_time_type::utc);
  spdlog::level::level_enum level = spdlog::level::info;
  const char* env = std::getenv("WSYNC_LOG_LEVEL");
  bool unknown = false;
  if (env != nullptr && *env != '\0') {
    level = spdlog::level::from_str(env);
    // from_str answers off for names it does not know.
    unknown = level == spdlog::level::off && std::string(env) != "off";
    if (unknown) level = spdlog::level::info;
  }
  logger->set_level(level);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
  if (unknown) {
    spdlog::warn(
        "WSYNC_LOG_LEVEL={} is not a level (trace, debug, info, warn, error, critical, off); "
        "using info",
        env);
  }
}

}  // namespace wsync
