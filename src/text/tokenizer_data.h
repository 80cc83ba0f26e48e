// The loaded tables of a Tokenizer (shared, immutable apart from the BPE word cache).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/added_tokens.h"
#include "text/bpe.h"
#include "text/pre_tokenizer.h"

namespace dsa::text {

enum class TokenKind : uint8_t { kNone, kVocab, kAdded, kSpecial };

struct TokenizerData {
  std::string source;                 // the file, for messages
  std::vector<std::string> id_bytes;  // [vocab_size] the bytes each id decodes to
  std::vector<TokenKind> id_kind;     // [vocab_size]
  std::unordered_map<std::string, int32_t> spelling_to_id;  // vocab spellings and added contents
  PreTokenizer pre_tokenizer;
  std::unique_ptr<Bpe> bpe;
  TokenTrie raw_added;         // added tokens with normalized=false: matched first
  TokenTrie normalized_added;  // the others: matched in the text between the first ones
  std::optional<int32_t> bos, eos;
};

// Parses tokenizer.json (and tokenizer_config.json when not empty); throws dsa::Error.
std::shared_ptr<const TokenizerData> load_tokenizer(std::string_view tokenizer_json,
                                                    std::string_view config_json,
                                                    std::string_view source);

}  // namespace dsa::text
