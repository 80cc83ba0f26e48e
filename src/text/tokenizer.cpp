#include "dsa/text/tokenizer.h"

#include <fstream>
#include <sstream>

#include "dsa/error.h"
#include "text/tokenizer_data.h"
#include "text/utf8.h"

namespace dsa::text {
namespace {

std::string read_file(const std::filesystem::path& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  require(in.good(), ErrorCode::kIo, "cannot read {} {}: {}", what, path.string(),
          std::filesystem::exists(path) ? "unreadable" : "no such file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Encodes text without added tokens: pre-tokenize, then BPE each piece.
void encode_plain(const TokenizerData& d, std::string_view text, size_t begin, size_t end,
                  PreTokenizer::Scratch& scratch, std::vector<Piece>& pieces,
                  std::vector<int32_t>& out) {
  if (begin == end) return;
  pieces.clear();
  d.pre_tokenizer.split(text.substr(begin, end - begin), uint32_t(begin), pieces, scratch);
  for (const Piece p : pieces) d.bpe->encode_word(text.substr(p.begin, p.length), out);
}

std::vector<int32_t> encode_text(const TokenizerData& d, std::string_view text, bool match_added) {
  require_utf8(text, "text");
  require(text.size() < (size_t(1) << 32), ErrorCode::kInvalidArgument,
          "text of {} bytes exceeds the 4 GiB limit", text.size());
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  const auto scratch = PreTokenizer::make_scratch();
  std::vector<Piece> pieces;
  // The gaps between normalized added tokens inside [begin, end).
  auto encode_gap = [&](size_t begin, size_t end) {
    while (begin < end) {
      const TokenTrie::Match m = match_added ? d.normalized_added.find(text.substr(0, end), begin)
                                             : TokenTrie::Match{end, 0, -1};
      encode_plain(d, text, begin, m.begin, *scratch, pieces, out);
      if (m.length == 0) break;
      out.push_back(m.id);
      begin = m.begin + m.length;
    }
  };
  size_t pos = 0;
  while (pos < text.size()) {
    const TokenTrie::Match m =
        match_added ? d.raw_added.find(text, pos) : TokenTrie::Match{text.size(), 0, -1};
    encode_gap(pos, m.begin);
    if (m.length == 0) break;
    out.push_back(m.id);
    pos = m.begin + m.length;
  }
  return out;
}

}  // namespace

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view config_json,
                               std::string_view source) {
  return Tokenizer(load_tokenizer(tokenizer_json, config_json, source));
}

Tokenizer Tokenizer::from_file(const std::filesystem::path& tokenizer_json,
                               const std::filesystem::path& tokenizer_config_json) {
  const std::string tok = read_file(tokenizer_json, "tokenizer file");
  const std::string config = tokenizer_config_json.empty()
                                 ? std::string()
                                 : read_file(tokenizer_config_json, "tokenizer config file");
  return from_json(tok, config, tokenizer_json.string());
}

Tokenizer Tokenizer::from_dir(const std::filesystem::path& dir) {
  require(std::filesystem::is_directory(dir), ErrorCode::kIo,
          "tokenizer directory {} does not exist", dir.string());
  const auto config = dir / "tokenizer_config.json";
  return from_file(dir / "tokenizer.json",
                   std::filesystem::exists(config) ? config : std::filesystem::path());
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  return encode_text(*data_, text, true);
}

std::vector<int32_t> Tokenizer::encode_ordinary(std::string_view text) const {
  return encode_text(*data_, text, false);
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  require(id >= 0 && id < vocab_size(), ErrorCode::kInvalidArgument,
          "token id {} is outside the vocabulary [0, {})", id, vocab_size());
  require(data_->id_kind[id] != TokenKind::kNone, ErrorCode::kInvalidArgument,
          "token id {} has no token in {} (vocabulary size {})", id, data_->source, vocab_size());
  return data_->id_bytes[id];
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (const int32_t id : ids) out += token_bytes(id);
  return out;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = data_->spelling_to_id.find(std::string(token));
  if (it == data_->spelling_to_id.end()) return std::nullopt;
  return it->second;
}

int32_t Tokenizer::vocab_size() const { return int32_t(data_->id_bytes.size()); }
std::optional<int32_t> Tokenizer::bos_id() const { return data_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return data_->eos; }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && data_->id_kind[id] == TokenKind::kSpecial;
}

std::string StreamDecoder::push(int32_t id) {
  pending_ += tokenizer_.token_bytes(id);
  std::string out;
  size_t pos = 0;
  while (pos < pending_.size()) {
    const Utf8Step step = utf8_step(pending_, pos);
    if (step.kind == Utf8Step::kIncomplete) break;
    if (step.kind == Utf8Step::kValid) {
      out.append(pending_, pos, step.length);
    } else {
      out += kReplacementChar;
    }
    pos += step.length;
  }
  pending_.erase(0, pos);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out = pending_.empty() ? std::string() : std::string(kReplacementChar);
  pending_.clear();
  return out;
}

}  // namespace dsa::text
