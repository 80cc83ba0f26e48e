// A Hugging Face `tokenizer.json` byte-level BPE tokenizer (the DeepSeek-V3 family's), exact to
// the ids Hugging Face `tokenizers` produces for the same file.
//
// What loads (anything else is refused with a dsa::Error naming the field and its value):
//   normalizer     null, or a Sequence with no normalizers
//   pre_tokenizer  ByteLevel (add_prefix_space false, use_regex false), alone or last in a
//                  Sequence after Split steps (pattern {"Regex": ...} or {"String": ...},
//                  behavior Isolated, invert false). Regexes run through PCRE2 (UTF, UCP, JIT).
//   model          BPE: vocab, merges ("a b" strings or ["a", "b"] pairs), ignore_merges; no
//                  dropout, unk_token, byte_fallback, continuing_subword_prefix or
//                  end_of_word_suffix. Every one of the 256 byte-level characters is in the vocab.
//   added_tokens   special or not, normalized or not; single_word / lstrip / rstrip refused.
//   post_processor null or ByteLevel (neither changes ids); decoder null or ByteLevel.
// tokenizer_config.json (optional) gives bos_token / eos_token, as a string or an AddedToken.
//
// Thread safety: a Tokenizer is immutable apart from its internal word cache, which is locked;
// encode/decode may run concurrently. Copies share the loaded tables.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dsa::text {

struct TokenizerData;  // the loaded tables (src/text/tokenizer_data.h)

class Tokenizer {
 public:
  // Reads tokenizer.json (and tokenizer_config.json when given). Missing or malformed files are
  // kIo errors; unsupported types or options are kInvalidArgument.
  static Tokenizer from_file(const std::filesystem::path& tokenizer_json,
                             const std::filesystem::path& tokenizer_config_json = {});
  // DIR/tokenizer.json, plus DIR/tokenizer_config.json when it exists.
  static Tokenizer from_dir(const std::filesystem::path& dir);
  // From the files' contents; `source` names them in error messages.
  static Tokenizer from_json(std::string_view tokenizer_json, std::string_view config_json = {},
                             std::string_view source = "tokenizer.json");

  // Added tokens in the text are matched first (leftmost, longest first: tokens with
  // normalized=false, then those with normalized=true in the rest, as Hugging Face does); the
  // text between them is pre-tokenized and BPE-encoded. No BOS/EOS is added. Text that is not
  // valid UTF-8 is a kInvalidArgument error naming the byte offset.
  std::vector<int32_t> encode(std::string_view text) const;
  // Like encode, but no added token is matched: "<｜User｜>" in the text is plain text.
  std::vector<int32_t> encode_ordinary(std::string_view text) const;

  // The exact bytes of the tokens (which need not be valid UTF-8 when the ids split a
  // character). An id outside [0, vocab_size()) or without a token is kInvalidArgument.
  std::string decode(std::span<const int32_t> ids) const;
  // The bytes of one token (the same rule as decode).
  std::string_view token_bytes(int32_t id) const;

  // The id of a vocabulary entry (in the file's byte-level spelling, e.g. "Ġthe") or of an
  // added token's content.
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // One past the largest id of the vocabulary and the added tokens.
  int32_t vocab_size() const;
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  // Whether the id is an added token marked "special": true.
  bool is_special(int32_t id) const;

 private:
  explicit Tokenizer(std::shared_ptr<const TokenizerData> data) : data_(std::move(data)) {}
  std::shared_ptr<const TokenizerData> data_;
};

// Turns a stream of ids into text for one request, never emitting part of a UTF-8 character.
// The output is always valid UTF-8: bytes that cannot start or continue a character are replaced
// by U+FFFD, one per maximal invalid subsequence (the Unicode "maximal subpart" rule, as Python's
// errors="replace"); a character still incomplete at finish() becomes one U+FFFD. So the
// concatenation of push() and finish() equals decode(ids) whenever that is valid UTF-8.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  // The text completed by this token (possibly empty). Throws like decode on a bad id.
  std::string push(int32_t id);
  // Flushes the held bytes of an incomplete character as U+FFFD (empty when none is held).
  std::string finish();

 private:
  Tokenizer tokenizer_;
  std::string pending_;  // bytes of a character not yet complete (at most 3)
};

// The project's own tokenizers, compiled into the program (data/tokenizers/<name>/).
struct TokenizerFiles {
  std::string_view tokenizer_json;
  std::string_view tokenizer_config_json;
};
// "tiny": a 1024-entry byte-level BPE with DeepSeek's pre-tokenizer and chat tokens. nullopt for
// an unknown name.
std::optional<TokenizerFiles> builtin_tokenizer(std::string_view name);

}  // namespace dsa::text
