#include "common/wire_text.h"

#include <string>

#include "gtest/gtest.h"

namespace wsync {
namespace {

TEST(ClipForWireTest, AShortTextIsKeptWhole) {
  EXPECT_EQ(ClipForWire("unknown transfer 't'"), "unknown transfer 't'");
  const std::string exact(kMaxWireMessageBytes, 'x');
  EXPECT_EQ(ClipForWire(exact), exact);
}

TEST(ClipForWireTest, ALongTextIsCutUnderTheLimitAndSaysHowMuchWasCut) {
  const std::string head = "Sync: unknown transfer '";
  const std::string text = head + std::string(15 << 20, 'x') + "'";
  const std::string clipped = ClipForWire(text);
  EXPECT_LE(clipped.size(), kMaxWireMessageBytes);
  EXPECT_EQ(clipped.rfind(head, 0), 0u) << "the start of the message stays";
  const size_t kept = clipped.find(" [... ");
  ASSERT_NE(kept, std::string::npos) << clipped.substr(clipped.size() - 64);
  EXPECT_EQ(clipped.substr(kept), " [... " + std::to_string(text.size() - kept) + " bytes cut]");
}

TEST(ClipForWireTest, NoCharacterIsSplit) {
  // Two-byte characters (é = C3 A9) across the cut, at both parities.
  for (size_t pad : {0, 1}) {
    std::string text(pad, 'a');
    while (text.size() < 4096) text += "\xC3\xA9";
    const std::string clipped = ClipForWire(text, 100);
    EXPECT_LE(clipped.size(), 100u);
    const size_t cut = clipped.find(" [... ");
    ASSERT_NE(cut, std::string::npos);
    ASSERT_GT(cut, 0u);
    // The kept part ends on a whole character: its last byte is not a lead byte.
    EXPECT_NE(static_cast<unsigned char>(clipped[cut - 1]), 0xC3) << "pad " << pad;
  }
}

}  // namespace
}  // namespace wsync
