#include "common/serving_state.h"

namespace wsync {

const char* ServingStateName(v1::ServingState s) {
  switch (s) {
    case v1::SERVING_STATE_SERVING:
      return "serving";
    case v1::SERVING_STATE_PAUSED:
      return "paused";
    case v1::SERVING_STATE_UPDATING:
      return "updating";
    case v1::SERVING_STATE_FAILED:
      return "failed";
    default:
      return "unknown";
  }
}

}  // namespace wsync
