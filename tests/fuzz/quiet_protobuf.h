// Fuzz targets parse arbitrary bytes as protos: protobuf logs every invalid
// UTF-8 string it meets, which would fill the fuzzer's log and slow it down.
#ifndef WSYNC_TESTS_FUZZ_QUIET_PROTOBUF_H_
#define WSYNC_TESTS_FUZZ_QUIET_PROTOBUF_H_

#include "google/protobuf/stubs/logging.h"

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

#endif  // WSYNC_TESTS_FUZZ_QUIET_PROTOBUF_H_
