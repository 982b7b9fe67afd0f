#include "common/strict_json.h"

#include <cctype>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace wsync {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

// A parsed JSON value: only what the checks need (strings keep their text).
struct Node {
  enum Kind { kScalar, kString, kArray, kObject } kind = kScalar;
  std::string text;                                   // kString
  std::vector<std::pair<std::string, Node>> members;  // kObject, in order
  std::vector<Node> items;                            // kArray
};

class Parser {
 public:
  explicit Parser(absl::string_view in) : in_(in) {}

  absl::Status Document(Node* out) {
    if (absl::Status s = Value(out, 0); !s.ok()) return s;
    SkipSpace();
    if (pos_ != in_.size()) return Error("text after the document");
    return absl::OkStatus();
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("not valid JSON at byte ", pos_, ": ", what));
  }
  void SkipSpace() {
    while (pos_ < in_.size() &&
           (in_[pos_] == ' ' || in_[pos_] == '\t' || in_[pos_] == '\n' || in_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Eat(char c) {
    SkipSpace();
    if (pos_ < in_.size() && in_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  absl::Status Value(Node* out, int depth) {
    if (depth > kMaxJsonDepth) {
      return Error(absl::StrCat("nested deeper than ", kMaxJsonDepth, " levels"));
    }
    SkipSpace();
    if (pos_ >= in_.size()) return Error("unexpected end");
    const char c = in_[pos_];
    if (c == '{') return Object(out, depth);
    if (c == '[') return Array(out, depth);
    if (c == '"') {
      out->kind = Node::kString;
      return String(&out->text);
    }
    out->kind = Node::kScalar;
    return Literal();
  }

  absl::Status Object(Node* out, int depth) {
    out->kind = Node::kObject;
    ++pos_;  // '{'
    if (Eat('}')) return absl::OkStatus();
    do {
      SkipSpace();
      if (pos_ >= in_.size() || in_[pos_] != '"') return Error("expected a key string");
      std::string key;
      if (absl::Status s = String(&key); !s.ok()) return s;
      if (!Eat(':')) return Error("expected ':'");
      out->members.emplace_back(std::move(key), Node());
      if (absl::Status s = Value(&out->members.back().second, depth + 1); !s.ok()) return s;
    } while (Eat(','));
    if (!Eat('}')) return Error("expected ',' or '}'");
    return absl::OkStatus();
  }

  absl::Status Array(Node* out, int depth) {
    out->kind = Node::kArray;
    ++pos_;  // '['
    if (Eat(']')) return absl::OkStatus();
    do {
      out->items.emplace_back();
      if (absl::Status s = Value(&out->items.back(), depth + 1); !s.ok()) return s;
    } while (Eat(','));
    if (!Eat(']')) return Error("expected ',' or ']'");
    return absl::OkStatus();
  }

  // A string's text, escapes decoded (\uXXXX kept as written: keys that
  // differ only in how they escape are rare enough to leave to protobuf).
  absl::Status String(std::string* out) {
    ++pos_;  // '"'
    while (pos_ < in_.size() && in_[pos_] != '"') {
      char c = in_[pos_++];
      if (static_cast<unsigned char>(c) < 0x20) return Error("control character in a string");
      if (c == '\\') {
        if (pos_ >= in_.size()) return Error("unterminated escape");
        c = in_[pos_++];
        switch (c) {
          case 'n':
            c = '\n';
            break;
          case 't':
            c = '\t';
            break;
          case 'r':
            c = '\r';
            break;
          case 'b':
            c = '\b';
            break;
          case 'f':
            c = '\f';
            break;
          case 'u':
            out->append("\\u");
            continue;
          case '"':
          case '\\':
          case '/':
            break;
          default:
            return Error("bad escape");
        }
      }
      out->push_back(c);
    }
    if (pos_ >= in_.size()) return Error("unterminated string");
    ++pos_;  // '"'
    return absl::OkStatus();
  }

  // A number, true, false or null.
  absl::Status Literal() {
    const size_t start = pos_;
    while (pos_ < in_.size() && (std::isalnum(static_cast<unsigned char>(in_[pos_])) ||
                                 in_[pos_] == '-' || in_[pos_] == '+' || in_[pos_] == '.')) {
      ++pos_;
    }
    if (pos_ == start) return Error("expected a value");
    return absl::OkStatus();
  }

  absl::string_view in_;
  size_t pos_ = 0;
};

// Walks a parsed document along the message types it encodes.
class Checker {
 public:
  explicit Checker(absl::string_view source) : source_(source) {}

  absl::Status Message(const Node& n, const Descriptor& type, const std::string& path,
                       const std::string& owner) {
    if (n.kind != Node::kObject) return absl::OkStatus();  // protobuf reports the type error
    const std::string here = OwnerOf(n, type, path, owner);
    std::set<std::string> seen;
    for (const auto& [key, value] : n.members) {
      const std::string at = path.empty() ? key : absl::StrCat(path, ".", key);
      if (!seen.insert(key).second) {
        return Fail(here, absl::StrCat("duplicate key '", key, "' at ", at));
      }
      const FieldDescriptor* f = FieldOf(type, key);
      if (f == nullptr || IsWellKnown(f)) {
        // Unknown fields are protobuf's to refuse; no duplicates anywhere.
        if (absl::Status s = NoDuplicates(value, at, here); !s.ok()) return s;
        continue;
      }
      if (absl::Status s = Field(value, *f, at, here); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  // The field a key names: its JSON (lowerCamelCase) or proto name.
  static const FieldDescriptor* FieldOf(const Descriptor& type, const std::string& key) {
    for (int i = 0; i < type.field_count(); ++i) {
      const FieldDescriptor* f = type.field(i);
      if (f->json_name() == key || f->name() == key) return f;
    }
    return nullptr;
  }

  absl::Status NoDuplicates(const Node& n, const std::string& at, const std::string& owner) {
    std::set<std::string> seen;
    for (const auto& [key, value] : n.members) {
      const std::string where = absl::StrCat(at, ".", key);
      if (!seen.insert(key).second) {
        return Fail(owner, absl::StrCat("duplicate key '", key, "' at ", where));
      }
      if (absl::Status s = NoDuplicates(value, where, owner); !s.ok()) return s;
    }
    for (size_t i = 0; i < n.items.size(); ++i) {
      if (absl::Status s = NoDuplicates(n.items[i], absl::StrCat(at, "[", i, "]"), owner); !s.ok())
        return s;
    }
    return absl::OkStatus();
  }

  static bool IsWellKnown(const FieldDescriptor* f) {
    return f->message_type() != nullptr &&
           f->message_type()->file()->package() == "google.protobuf";
  }

  // "tensor 'w'" for an object of a named type with a "name" string member.
  static std::string OwnerOf(const Node& n, const Descriptor& type, const std::string& path,
                             const std::string& owner) {
    for (const auto& [key, value] : n.members) {
      if (key != "name" || value.kind != Node::kString) continue;
      const std::string kind = type.name() == "TensorLayout" ? "tensor"
                               : type.name() == "Side"       ? "side"
                                                             : type.name();
      return absl::StrCat(kind, " '", value.text, "' (", path.empty() ? "root" : path, ")");
    }
    return owner;
  }

  absl::Status Fail(const std::string& owner, const std::string& what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": ", owner.empty() ? "" : absl::StrCat(owner, ": "), what));
  }

  absl::Status Field(const Node& v, const FieldDescriptor& f, const std::string& at,
                     const std::string& owner) {
    if (f.is_map()) return Map(v, f, at, owner);
    if (f.is_repeated()) {
      if (v.kind == Node::kObject || v.kind == Node::kString) {
        return Fail(owner, absl::StrCat("field '", f.json_name(), "' at ", at,
                                        " must be a list, not ", Kind(v)));
      }
      for (size_t i = 0; i < v.items.size(); ++i) {
        if (absl::Status s = Element(v.items[i], f, absl::StrCat(at, "[", i, "]"), owner); !s.ok())
          return s;
      }
      return absl::OkStatus();
    }
    return Element(v, f, at, owner);
  }

  absl::Status Element(const Node& v, const FieldDescriptor& f, const std::string& at,
                       const std::string& owner) {
    if (f.message_type() != nullptr) return Message(v, *f.message_type(), at, owner);
    if (v.kind == Node::kArray || v.kind == Node::kObject) {
      return Fail(owner, absl::StrCat("field '", f.json_name(), "' at ", at, " holds ", Kind(v),
                                      " where a single value belongs",
                                      f.is_repeated() ? " (nested lists are not flattened)" : ""));
    }
    return absl::OkStatus();
  }

  absl::Status Map(const Node& v, const FieldDescriptor& f, const std::string& at,
                   const std::string& owner) {
    if (v.kind != Node::kObject) return absl::OkStatus();
    const FieldDescriptor* value = f.message_type()->map_value();
    std::set<std::string> seen;
    for (const auto& [key, item] : v.members) {
      if (!seen.insert(key).second) {
        return Fail(owner,
                    absl::StrCat("duplicate key '", key, "' in map '", f.json_name(), "' at ", at));
      }
      if (absl::Status s = Element(item, *value, absl::StrCat(at, "[\"", key, "\"]"), owner);
          !s.ok())
        return s;
    }
    return absl::OkStatus();
  }

  static const char* Kind(const Node& v) {
    switch (v.kind) {
      case Node::kArray:
        return "a list";
      case Node::kObject:
        return "an object";
      case Node::kString:
        return "a string";
      default:
        return "a value";
    }
  }

  std::string source_;
};

}  // namespace

absl::Status CheckStrictJson(absl::string_view json, const Descriptor& root,
                             absl::string_view source) {
  Node doc;
  Parser parser(json);
  if (absl::Status s = parser.Document(&doc); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", s.message()));
  }
  return Checker(source).Message(doc, root, "", "");
}

}  // namespace wsync
