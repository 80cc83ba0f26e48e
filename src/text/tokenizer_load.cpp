// tokenizer.json / tokenizer_config.json → TokenizerData: every field the encoder depends on is
// checked, and anything not implemented is refused by name.
#include <nlohmann/json.hpp>

#include "dsa/error.h"
#include "text/byte_level.h"
#include "text/tokenizer_data.h"

namespace dsa::text {
namespace {

using nlohmann::json;

struct Loader {
  std::string_view source;

  std::string type(const json& j, const std::string& where) const {
    require(j.is_object() && j.contains("type") && j["type"].is_string(), ErrorCode::kIo,
            "{}: {} has no \"type\" string", source, where);
    return j["type"].get<std::string>();
  }

  // An option that must be null/absent (or equal to one of the harmless values).
  void require_unset(const json& j, const char* key, const std::string& where,
                     const std::vector<json>& allowed = {}) const {
    if (!j.contains(key) || j[key].is_null()) return;
    for (const json& a : allowed)
      if (j[key] == a) return;
    fail(ErrorCode::kInvalidArgument, "{}: unsupported {}.{} = {} (not implemented)", source, where,
         key, j[key].dump());
  }

  void check_normalizer(const json& n) const {
    if (n.is_null()) return;
    const std::string t = type(n, "normalizer");
    require(t == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array() &&
                n["normalizers"].empty(),
            ErrorCode::kInvalidArgument,
            "{}: unsupported normalizer {} at normalizer (only none or an empty Sequence is "
            "implemented)",
            source, t == "Sequence" ? n.dump().substr(0, 120) : "type '" + t + "'");
  }

  void check_byte_level_or_null(const json& j, const char* field) const {
    if (j.is_null()) return;
    const std::string t = type(j, field);
    require(t == "ByteLevel", ErrorCode::kInvalidArgument,
            "{}: unsupported {} type '{}' at {} (only ByteLevel is implemented)", source, field, t,
            field);
  }

  int32_t id_of(const json& v, const std::string& where) const {
    require(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < (1 << 30),
            ErrorCode::kIo, "{}: {} = {} is not an id in [0, 2^30)", source, where, v.dump());
    return v.get<int32_t>();
  }
};

void grow(TokenizerData& d, int32_t id) {
  if (size_t(id) >= d.id_bytes.size()) {
    d.id_bytes.resize(id + 1);
    d.id_kind.resize(id + 1, TokenKind::kNone);
  }
}

std::optional<int32_t> config_token(const Loader& L, const TokenizerData& d, const json& config,
                                    const char* key) {
  if (!config.contains(key) || config[key].is_null()) return std::nullopt;
  const json& v = config[key];
  std::string content;
  if (v.is_string()) {
    content = v.get<std::string>();
  } else if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    content = v["content"].get<std::string>();
  } else {
    fail(ErrorCode::kIo, "{}: tokenizer_config.json {} = {} is neither a string nor a token",
         L.source, key, v.dump());
  }
  auto it = d.spelling_to_id.find(content);
  require(it != d.spelling_to_id.end(), ErrorCode::kInvalidArgument,
          "{}: tokenizer_config.json {} '{}' is not a token of tokenizer.json", L.source, key,
          content);
  return it->second;
}

std::vector<Merge> read_merges(const Loader& L, const json& merges,
                               const std::unordered_map<std::string, int32_t>& vocab) {
  std::vector<Merge> out;
  out.reserve(merges.size());
  auto id = [&](const std::string& s, size_t i, const char* what) {
    auto it = vocab.find(s);
    require(it != vocab.end(), ErrorCode::kIo, "{}: model.merges[{}]: {} '{}' is not in the vocab",
            L.source, i, what, s);
    return it->second;
  };
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    std::string a, b;
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      require(space != std::string::npos && s.find(' ', space + 1) == std::string::npos,
              ErrorCode::kIo, "{}: model.merges[{}] = '{}' is not two tokens separated by a space",
              L.source, i, s);
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      fail(ErrorCode::kIo, "{}: model.merges[{}] = {} is neither \"a b\" nor [\"a\", \"b\"]",
           L.source, i, m.dump());
    }
    out.push_back({id(a, i, "left part"), id(b, i, "right part"), id(a + b, i, "merged token")});
  }
  return out;
}

void load_model(const Loader& L, const json& model, TokenizerData& d) {
  require(model.is_object(), ErrorCode::kIo, "{}: \"model\" is missing", L.source);
  const std::string t = L.type(model, "model");
  require(t == "BPE", ErrorCode::kInvalidArgument,
          "{}: unsupported model type '{}' at model (only BPE is implemented)", L.source, t);
  L.require_unset(model, "dropout", "model");
  L.require_unset(model, "unk_token", "model");
  L.require_unset(model, "continuing_subword_prefix", "model", {""});
  L.require_unset(model, "end_of_word_suffix", "model", {""});
  L.require_unset(model, "byte_fallback", "model", {false});
  const bool ignore_merges = model.value("ignore_merges", false);
  require(model.contains("vocab") && model["vocab"].is_object(), ErrorCode::kIo,
          "{}: model.vocab is missing", L.source);
  require(model.contains("merges") && model["merges"].is_array(), ErrorCode::kIo,
          "{}: model.merges is missing", L.source);

  std::unordered_map<std::string, int32_t> vocab, whole_words;
  vocab.reserve(model["vocab"].size());
  for (const auto& [spelling, v] : model["vocab"].items()) {
    const int32_t id = L.id_of(v, "model.vocab[\"" + spelling + "\"]");
    vocab.emplace(spelling, id);
    grow(d, id);
    // A spelling outside the byte-level alphabet decodes to its own UTF-8 (as HF's decoder does).
    std::optional<std::string> bytes = byte_level_to_bytes(spelling);
    d.id_bytes[id] = bytes ? *bytes : spelling;
    d.id_kind[id] = TokenKind::kVocab;
    if (ignore_merges && bytes) whole_words.emplace(*bytes, id);
  }
  std::array<int32_t, 256> byte_ids{};
  std::string spelling;
  for (int b = 0; b < 256; ++b) {
    spelling.clear();
    const char32_t cp = byte_level_alphabet()[b];
    if (cp < 0x80) {
      spelling += char(cp);
    } else {
      spelling += char(0xC0 | (cp >> 6));
      spelling += char(0x80 | (cp & 0x3F));
    }
    auto it = vocab.find(spelling);
    require(it != vocab.end(), ErrorCode::kInvalidArgument,
            "{}: model.vocab lacks the byte-level character '{}' for byte 0x{:02X}", L.source,
            spelling, b);
    byte_ids[b] = it->second;
  }
  const std::vector<Merge> merges = read_merges(L, model["merges"], vocab);
  d.bpe = std::make_unique<Bpe>(byte_ids, merges, std::move(whole_words), ignore_merges);
  d.spelling_to_id = std::move(vocab);
}

void load_added_tokens(const Loader& L, const json& added, TokenizerData& d) {
  if (added.is_null()) return;
  require(added.is_array(), ErrorCode::kIo, "{}: added_tokens is not an array", L.source);
  for (size_t i = 0; i < added.size(); ++i) {
    const json& t = added[i];
    const std::string where = fmt::format("added_tokens[{}]", i);
    require(t.is_object() && t.contains("id") && t.contains("content") && t["content"].is_string(),
            ErrorCode::kIo, "{}: {} needs an id and a content string", L.source, where);
    const int32_t id = L.id_of(t["id"], where + ".id");
    const std::string content = t["content"].get<std::string>();
    require(!content.empty(), ErrorCode::kIo, "{}: {}.content is empty", L.source, where);
    for (const char* key : {"single_word", "lstrip", "rstrip"})
      L.require_unset(t, key, where, {false});
    const bool special = t.value("special", false);
    const bool normalized = t.value("normalized", !special);
    grow(d, id);
    d.id_bytes[id] = content;
    d.id_kind[id] = special ? TokenKind::kSpecial : TokenKind::kAdded;
    d.spelling_to_id[content] = id;
    (normalized ? d.normalized_added : d.raw_added).add(content, id);
  }
}

}  // namespace

std::shared_ptr<const TokenizerData> load_tokenizer(std::string_view tokenizer_json,
                                                    std::string_view config_json,
                                                    std::string_view source) {
  const Loader L{source};
  json j;
  try {
    j = json::parse(tokenizer_json);
  } catch (const json::parse_error& e) {
    fail(ErrorCode::kIo, "{}: not valid JSON: {}", source, e.what());
  }
  require(j.is_object(), ErrorCode::kIo, "{}: not a JSON object", source);
  auto d = std::make_shared<TokenizerData>();
  d->source = source;
  L.require_unset(j, "truncation", "tokenizer");
  L.require_unset(j, "padding", "tokenizer");
  L.check_normalizer(j.value("normalizer", json()));
  d->pre_tokenizer = PreTokenizer::from_json(j.value("pre_tokenizer", json()), source);
  L.check_byte_level_or_null(j.value("post_processor", json()), "post_processor");
  L.check_byte_level_or_null(j.value("decoder", json()), "decoder");
  load_model(L, j.value("model", json()), *d);
  load_added_tokens(L, j.value("added_tokens", json()), *d);
  if (!config_json.empty()) {
    json config;
    try {
      config = json::parse(config_json);
    } catch (const json::parse_error& e) {
      fail(ErrorCode::kIo, "{}: tokenizer_config.json is not valid JSON: {}", source, e.what());
    }
    d->bos = config_token(L, *d, config, "bos_token");
    d->eos = config_token(L, *d, config, "eos_token");
  }
  return d;
}

}  // namespace dsa::text
