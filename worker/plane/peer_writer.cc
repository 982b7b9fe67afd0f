#include "worker/plane/peer_writer.h"

namespace wsync::exec {

ItemsHandle PeerWriter::Prepare(absl::Span<const CopyItem> items) {
  (void)items;
  return ItemsHandle{++next_handle_};
}

}  // namespace wsync::exec
