#include "common/wire_text.h"

#include "absl/strings/str_cat.h"

namespace wsync {

std::string ClipForWire(absl::string_view text, size_t max) {
  if (text.size() <= max) return std::string(text);
  // The suffix names the bytes cut: " [... " + up to 20 digits + " bytes cut]".
  constexpr size_t kSuffixRoom = 40;
  size_t keep = max > kSuffixRoom ? max - kSuffixRoom : 0;
  // Back off continuation bytes (10xxxxxx) so no character is split.
  while (keep > 0 && (static_cast<unsigned char>(text[keep]) & 0xC0) == 0x80) --keep;
  return absl::StrCat(text.substr(0, keep), " [... ", text.size() - keep, " bytes cut]");
}

}  // namespace wsync
