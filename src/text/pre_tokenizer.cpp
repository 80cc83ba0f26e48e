#include "text/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include "dsa/error.h"

namespace dsa::text {

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  bool jit = false;
  std::string pattern;
  ~Regex() { pcre2_code_free(code); }
};

namespace {

using nlohmann::json;

std::string type_of(const json& j, std::string_view source, const std::string& where) {
  require(j.is_object() && j.contains("type") && j["type"].is_string(), ErrorCode::kIo,
          "{}: {} has no \"type\" string", source, where);
  return j["type"].get<std::string>();
}

// A boolean option that must have one value (absent counts as `expected`).
void require_flag(const json& j, const char* key, bool expected, std::string_view source,
                  const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return;
  require(j[key].is_boolean() && j[key].get<bool>() == expected, ErrorCode::kInvalidArgument,
          "{}: unsupported {}.{} = {} (only {} is implemented)", source, where, key, j[key].dump(),
          expected);
}

// Hugging Face runs these patterns through Oniguruma, whose \s is Unicode White_Space. PCRE2's
// \s in UCP mode also takes U+180E (MONGOLIAN VOWEL SEPARATOR, a format character since Unicode
// 6.3), which splits text differently, so \s / \S become \p{White_Space} / \P{White_Space}
// (valid inside character classes too). Escaped pairs are copied whole, so \\s stays literal.
std::string onig_to_pcre2(const std::string& pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '\\' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    const char next = pattern[++i];
    if (next == 's') {
      out += "\\p{White_Space}";
    } else if (next == 'S') {
      out += "\\P{White_Space}";
    } else {
      out += '\\';
      out += next;
    }
  }
  return out;
}

std::unique_ptr<PreTokenizer::Regex> compile_split(const json& step, std::string_view source,
                                                   const std::string& where) {
  const std::string behavior = step.value("behavior", std::string());
  require(behavior == "Isolated", ErrorCode::kInvalidArgument,
          "{}: unsupported Split behavior '{}' at {} (only Isolated is implemented)", source,
          behavior, where);
  require_flag(step, "invert", false, source, where);
  require(step.contains("pattern") && step["pattern"].is_object(), ErrorCode::kIo,
          "{}: {}.pattern is missing", source, where);
  const json& p = step["pattern"];
  auto re = std::make_unique<PreTokenizer::Regex>();
  uint32_t options = PCRE2_UTF | PCRE2_NO_UTF_CHECK;
  if (p.contains("Regex") && p["Regex"].is_string()) {
    re->pattern = p["Regex"].get<std::string>();
    options |= PCRE2_UCP;
  } else if (p.contains("String") && p["String"].is_string()) {
    re->pattern = p["String"].get<std::string>();
    options |= PCRE2_LITERAL;
  } else {
    fail(ErrorCode::kInvalidArgument,
         "{}: unsupported {}.pattern {} (expected {{\"Regex\": ...}} or {{\"String\": ...}})",
         source, where, p.dump());
  }
  const std::string compiled = options & PCRE2_UCP ? onig_to_pcre2(re->pattern) : re->pattern;
  int error = 0;
  PCRE2_SIZE offset = 0;
  re->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled.data()), compiled.size(), options,
                           &error, &offset, nullptr);
  if (!re->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    fail(ErrorCode::kInvalidArgument, "{}: {}.pattern does not compile at offset {}: {}", source,
         where, offset, reinterpret_cast<const char*>(message));
  }
  re->jit = pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0;
  return re;
}

}  // namespace

// PCRE2 match data and a JIT stack large enough for long whitespace runs (the lookahead rule
// backtracks over them).
class PreTokenizer::Scratch {
 public:
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
  Scratch() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~Scratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  std::vector<Piece> current, next;
};

std::unique_ptr<PreTokenizer::Scratch, PreTokenizer::ScratchDeleter> PreTokenizer::make_scratch() {
  return std::unique_ptr<Scratch, ScratchDeleter>(new Scratch());
}

void PreTokenizer::ScratchDeleter::operator()(Scratch* s) const { delete s; }

PreTokenizer::PreTokenizer() = default;
PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

PreTokenizer PreTokenizer::from_json(const json& pre, std::string_view source) {
  require(!pre.is_null(), ErrorCode::kInvalidArgument,
          "{}: pre_tokenizer is null; a byte-level BPE needs ByteLevel", source);
  std::vector<std::pair<const json*, std::string>> steps;
  const std::string type = type_of(pre, source, "pre_tokenizer");
  if (type == "Sequence") {
    require(pre.contains("pretokenizers") && pre["pretokenizers"].is_array(), ErrorCode::kIo,
            "{}: pre_tokenizer.pretokenizers is missing", source);
    for (size_t i = 0; i < pre["pretokenizers"].size(); ++i)
      steps.emplace_back(&pre["pretokenizers"][i],
                         fmt::format("pre_tokenizer.pretokenizers[{}]", i));
  } else {
    steps.emplace_back(&pre, "pre_tokenizer");
  }
  PreTokenizer out;
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& [step, where] = steps[i];
    const std::string t = type_of(*step, source, where);
    if (t == "Split") {
      out.splits_.push_back(compile_split(*step, source, where));
    } else if (t == "ByteLevel") {
      require(i + 1 == steps.size(), ErrorCode::kInvalidArgument,
              "{}: ByteLevel at {} must be the last pre-tokenizer step", source, where);
      require_flag(*step, "add_prefix_space", false, source, where);
      require_flag(*step, "use_regex", false, source, where);
    } else {
      fail(ErrorCode::kInvalidArgument, "{}: unsupported pre_tokenizer type '{}' at {}", source, t,
           where);
    }
  }
  require(type_of(*steps.back().first, source, steps.back().second) == "ByteLevel",
          ErrorCode::kInvalidArgument,
          "{}: the pre_tokenizer must end with ByteLevel (a byte-level BPE); {} is '{}'", source,
          steps.back().second, type_of(*steps.back().first, source, steps.back().second));
  return out;
}

void PreTokenizer::split(std::string_view text, uint32_t base, std::vector<Piece>& out,
                         Scratch& scratch) const {
  if (text.empty()) return;
  std::vector<Piece>& current = scratch.current;
  std::vector<Piece>& next = scratch.next;
  current.assign(1, Piece{0, uint32_t(text.size())});
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  for (const auto& re : splits_) {
    next.clear();
    for (const Piece piece : current) {
      // Matches and the gaps between them become pieces (HF's Isolated); empty ones are dropped.
      const PCRE2_SIZE end = piece.begin + piece.length;
      PCRE2_SIZE pos = piece.begin, emitted = piece.begin;
      while (pos < end) {
        // The subject is the piece alone, so lookarounds see only its own bytes.
        const int rc =
            re->jit ? pcre2_jit_match(re->code, subject + piece.begin, piece.length,
                                      pos - piece.begin, 0, scratch.data, scratch.context)
                    : pcre2_match(re->code, subject + piece.begin, piece.length, pos - piece.begin,
                                  PCRE2_NO_UTF_CHECK, scratch.data, scratch.context);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          PCRE2_UCHAR message[256];
          pcre2_get_error_message(rc, message, sizeof(message));
          fail(ErrorCode::kInvalidArgument, "pre-tokenizer regex '{}' failed on {} bytes: {}",
               re->pattern, piece.length, reinterpret_cast<const char*>(message));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.data);
        const PCRE2_SIZE m0 = piece.begin + ov[0], m1 = piece.begin + ov[1];
        if (m1 == m0) {  // an empty match: step over one character
          pos = m0 + 1;
          while (pos < end && (uint8_t(text[pos]) & 0xC0) == 0x80) ++pos;
          continue;
        }
        if (m0 > emitted) next.push_back({uint32_t(emitted), uint32_t(m0 - emitted)});
        next.push_back({uint32_t(m0), uint32_t(m1 - m0)});
        emitted = pos = m1;
      }
      if (end > emitted) next.push_back({uint32_t(emitted), uint32_t(end - emitted)});
    }
    current.swap(next);
  }
  for (const Piece p : current) out.push_back({p.begin + base, p.length});
}

}  // namespace dsa::text
