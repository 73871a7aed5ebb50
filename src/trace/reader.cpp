#include "trace/reader.h"

#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "trace/line_reader.h"

namespace crescent::trace {
namespace {

// Why a line is invalid: a short reason (the SkipReport key) and the full message.
struct LineError {
  std::string_view reason;
  std::string message;
};

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

// `text` cut short for messages.
std::string shorten(std::string text) {
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

// A JSON value as it appears in the line, cut short for messages.
std::string excerpt(simdjson::dom::element value) {
  return shorten(simdjson::minify(value));
}

// Why a JSON value is not an integer in the range a field allows.
struct CountProblem {
  std::string_view reason;    // SkipReport reason
  std::string_view expected;  // completes "must be ..."
};

constexpr std::string_view kCountExpected = "a non-negative integer";  // timestamp, input/output_length
constexpr std::string_view kCountBelowExpected = "a non-negative integer below 2^63";  // ... when >= 2^63
constexpr std::string_view kKeyExpected = "an integer in [0, 2^64)";                   // hash_ids entries
constexpr std::string_view kKeysExpected = "an array of integers in [0, 2^64)";        // hash_ids
constexpr std::string_view kTokenExpected = "an integer in [0, 2^63)";                 // token_ids entries
constexpr std::string_view kTokensExpected = "an array of integers in [0, 2^63)";      // token_ids

// The problem with `value` as an integer in [0, 2^63), or none, in which case the integer is stored in `out`.
std::optional<CountProblem> count_problem(simdjson::dom::element value, int64_t& out) {
  switch (value.type()) {
    case simdjson::dom::element_type::INT64:
      out = value.get_int64().value_unsafe();
      if (out >= 0) return std::nullopt;
      return CountProblem{"negative value", kCountExpected};
    case simdjson::dom::element_type::UINT64:
      return CountProblem{"out of range", kCountBelowExpected};
    default:
      return CountProblem{"not an integer", kCountExpected};
  }
}

// The problem with `value` as a token id, an integer in [0, 2^63), or none, in which case it is stored in
// `out`.
std::optional<CountProblem> token_problem(simdjson::dom::element value, int64_t& out) {
  std::optional<CountProblem> problem = count_problem(value, out);
  if (problem) problem->expected = kTokenExpected;
  return problem;
}

// The problem with `value` as an integer in [0, 2^64), or none, in which case the integer is stored in `out`.
std::optional<CountProblem> key_problem(simdjson::dom::element value, BlockKey& out) {
  switch (value.type()) {
    case simdjson::dom::element_type::INT64: {
      const int64_t key = value.get_int64().value_unsafe();
      if (key < 0) return CountProblem{"negative value", kKeyExpected};
      out = static_cast<BlockKey>(key);
      return std::nullopt;
    }
    case simdjson::dom::element_type::UINT64:  // simdjson's type for integers in [2^63, 2^64)
      out = value.get_uint64().value_unsafe();
      return std::nullopt;
    default:
      return CountProblem{"not an integer", kKeyExpected};
  }
}

// The first integer literal of a JSON line that simdjson cannot represent (below -2^63 or above 2^64 - 1):
// simdjson 3.0.1 fails the whole line with NUMBER_ERROR instead of returning such a number, so the line is
// read again by nlohmann::json's SAX parser, which hands it over as a float along with its text. Follows the
// structure just enough to name the field: a member of the top-level object, or an entry of its "hash_ids" or
// "token_ids".
class UnrepresentableIntegerFinder final : public nlohmann::json_sax<nlohmann::json> {
 public:
  bool found = false;
  // "timestamp", "hash_ids[2]", "token_ids[5]", ...; empty when not a field the reader checks.
  std::string field;
  std::string text;   // the literal, as written
  bool negative = false;

  bool number_float(number_float_t, const string_t& literal) override {
    if (literal.find_first_of(".eE") != string_t::npos) return value();  // a float simdjson read fine
    found = true;
    text = literal;
    negative = literal.starts_with('-');
    if (open_.size() == 1 && open_[0].object && is_checked_field(open_[0].key)) {
      field = open_[0].key;
    } else if (open_.size() == 2 && (open_[0].key == "hash_ids" || open_[0].key == "token_ids") &&
               !open_[1].object) {
      field = fmt::format("{}[{}]", open_[0].key, open_[1].entries);
    }
    return false;  // stop: the first one is reported
  }
  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override { return open(true); }
  bool key(string_t& name) override {
    open_.back().key = name;
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(false); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;  // malformed: simdjson's own message stands
  }

 private:
  struct Container {
    bool object;
    std::string key;     // objects: the current member's name
    size_t entries = 0;  // arrays: values seen so far (the index of the next)
  };
  static bool is_checked_field(std::string_view key) {
    return key == "timestamp" || key == "input_length" || key == "output_length" || key == "hash_ids" ||
           key == "session_id" || key == "token_ids";
  }
  bool value() {
    if (!open_.empty()) ++open_.back().entries;
    return true;
  }
  bool open(bool object) {
    open_.push_back({object, "", 0});
    return true;
  }
  bool close() {
    open_.pop_back();
    return value();
  }
  std::vector<Container> open_;
};

}  // namespace

struct TraceReader::Impl {
  std::string path;
  ReadOptions options;
  std::unique_ptr<LineReader> lines;
  // The current line without its line ending ("\n" or "\r\n") and, on line 1, without a UTF-8 BOM (plus
  // simdjson padding while parsing).
  std::string line;
  bool line_too_long = false;
  int64_t line_number = 0;
  int64_t previous_timestamp_ms = 0;  // of the last valid line; timestamps are >= 0
  simdjson::dom::parser parser;
  SkipReport skipped;
  Status failed;  // sticky: the error every later next() returns

  // Reads the next line into `line`: true when there is one, false at the end of the input.
  Result<bool> read_line() {
    Result<bool> more = lines->next();
    if (!more.ok() || !*more) return more;
    line.swap(lines->line());  // the buffer goes back to the LineReader, which clears it
    line_too_long = lines->line_too_long();
    line_number = lines->line_number();
    return true;
  }

  LineError field_error(std::string_view reason, std::string_view field, std::string_view problem) const {
    return {reason, fmt::format("{}:{}: field '{}': {}", path, line_number, field, problem)};
  }

  LineError count_error(const CountProblem& problem, std::string_view field,
                        simdjson::dom::element value) const {
    return field_error(problem.reason, field,
                       fmt::format("must be {}, got {}", problem.expected, excerpt(value)));
  }

  // Reads the field `name` of `object` as an integer in [0, 2^63), or [1, 2^63) when `positive`, into `out`.
  std::optional<LineError> read_count_field(simdjson::dom::object object, const char* name, int64_t& out,
                                            bool positive = false) const {
    simdjson::dom::element value;
    if (object.at_key(name).get(value)) {
      return LineError{"missing field", fmt::format("{}:{}: missing field '{}'", path, line_number, name)};
    }
    if (auto problem = count_problem(value, out)) return count_error(*problem, name, value);
    if (positive && out == 0) return field_error("zero length", name, "must be >= 1, got 0");
    return std::nullopt;
  }

  // Reads the optional field "session_id" (an integer in [0, 2^63)) into out.session_id.
  std::optional<LineError> read_session_id(simdjson::dom::object object, Request& out) const {
    out.session_id.reset();
    simdjson::dom::element value;
    if (object.at_key("session_id").get(value)) return std::nullopt;  // absent: no session
    int64_t session = 0;
    if (auto problem = count_problem(value, session)) return count_error(*problem, "session_id", value);
    out.session_id = session;
    return std::nullopt;
  }

  // Reads the field "token_ids" into out.token_ids: exactly out.input_tokens integers in [0, 2^63).
  std::optional<LineError> read_token_ids(simdjson::dom::object object, Request& out) const {
    simdjson::dom::element value;
    if (object.at_key("token_ids").get(value)) {
      return LineError{"missing field",
                       fmt::format("{}:{}: missing field 'token_ids' (block keys from token ids need the "
                                   "prompt's tokens on every line)",
                                   path, line_number)};
    }
    simdjson::dom::array tokens;
    if (value.get(tokens)) {
      return field_error("not an array", "token_ids",
                         fmt::format("must be {}, got {}", kTokensExpected, excerpt(value)));
    }
    if (static_cast<int64_t>(tokens.size()) != out.input_tokens) {
      return field_error(
          "token count mismatch", "token_ids",
          fmt::format("has {} entries, expected input_length = {}", tokens.size(), out.input_tokens));
    }
    out.token_ids.reserve(tokens.size());
    for (simdjson::dom::element token : tokens) {
      int64_t id = 0;
      if (auto problem = token_problem(token, id)) {
        return count_error(*problem, fmt::format("token_ids[{}]", out.token_ids.size()), token);
      }
      out.token_ids.push_back(id);
    }
    return std::nullopt;
  }

  // The error for a line simdjson rejected with NUMBER_ERROR: names the field when the cause is an integer
  // outside [-2^63, 2^64), which simdjson cannot represent.
  LineError number_error(size_t length) const {
    UnrepresentableIntegerFinder found;
    nlohmann::json::sax_parse(std::string_view(line.data(), length), &found);
    if (!found.found) {
      return LineError{"not JSON", fmt::format("{}:{}: not JSON: {}", path, line_number,
                                               simdjson::error_message(simdjson::NUMBER_ERROR))};
    }
    const std::string text = shorten(found.text);
    const std::string_view reason = found.negative ? "negative value" : "out of range";
    if (found.field.empty()) {
      return LineError{"out of range", fmt::format("{}:{}: number out of range (integers must be in [-2^63, "
                                                   "2^64)), got {}",
                                                   path, line_number, text)};
    }
    if (found.field == "hash_ids") {
      return field_error("not an array", "hash_ids", fmt::format("must be {}, got {}", kKeysExpected, text));
    }
    if (found.field.starts_with("hash_ids[")) {
      return field_error(reason, found.field, fmt::format("must be {}, got {}", kKeyExpected, text));
    }
    if (found.field == "token_ids") {
      return field_error("not an array", "token_ids",
                         fmt::format("must be {}, got {}", kTokensExpected, text));
    }
    if (found.field.starts_with("token_ids[")) {
      return field_error(reason, found.field, fmt::format("must be {}, got {}", kTokenExpected, text));
    }
    return field_error(
        reason, found.field,
        fmt::format("must be {}, got {}", found.negative ? kCountExpected : kCountBelowExpected, text));
  }

  // Parses and validates `line` into `out`.
  std::optional<LineError> parse_line(Request& out) {
    if (line_too_long) {
      return LineError{"line too long",
                       fmt::format("{}:{}: line longer than {} bytes", path, line_number, kMaxLineBytes)};
    }
    const size_t length = line.size();
    line.append(simdjson::SIMDJSON_PADDING, ' ');
    simdjson::dom::element document;
    if (simdjson::error_code error = parser.parse(line.data(), length, false).get(document)) {
      if (error == simdjson::NUMBER_ERROR) return number_error(length);
      return LineError{"not JSON",
                       fmt::format("{}:{}: not JSON: {}", path, line_number, simdjson::error_message(error))};
    }
    simdjson::dom::object object;
    if (document.get(object)) {
      return LineError{"not an object",
                       fmt::format("{}:{}: not a JSON object, got {}", path, line_number, excerpt(document))};
    }
    if (auto error = read_count_field(object, "timestamp", out.timestamp_ms)) return error;
    if (auto error = read_count_field(object, "input_length", out.input_tokens, /*positive=*/true)) {
      return error;
    }
    if (auto error = read_count_field(object, "output_length", out.output_tokens, /*positive=*/true)) {
      return error;
    }
    if (options.length_divisor > 1) {  // a smaller model's trace: every length divided, rounded up
      out.input_tokens = (out.input_tokens + options.length_divisor - 1) / options.length_divisor;
      out.output_tokens = (out.output_tokens + options.length_divisor - 1) / options.length_divisor;
    }
    simdjson::dom::element hash_ids;
    if (object.at_key("hash_ids").get(hash_ids)) {
      return LineError{"missing field", fmt::format("{}:{}: missing field 'hash_ids'", path, line_number)};
    }
    simdjson::dom::array keys;
    if (hash_ids.get(keys)) {
      return field_error("not an array", "hash_ids",
                         fmt::format("must be {}, got {}", kKeysExpected, excerpt(hash_ids)));
    }
    out.block_keys.clear();
    out.block_keys.reserve(keys.size());
    for (simdjson::dom::element key : keys) {
      BlockKey value = 0;
      if (auto problem = key_problem(key, value)) {
        return count_error(*problem, fmt::format("hash_ids[{}]", out.block_keys.size()), key);
      }
      out.block_keys.push_back(value);
    }
    if (auto error = read_session_id(object, out)) return error;
    out.token_ids.clear();
    if (options.keys_from_token_ids) {
      if (auto error = read_token_ids(object, out)) return error;
      // The hash_ids were checked above as integers; the keys now come from the tokens, whose count matches
      // input_length, so there are ceil(input_length / block size) of them.
      out.block_keys =
          kv::shipped_block_keys(out.token_ids, options.block_size_tokens, options.token_key_seed);
    }
    const int64_t block_size = options.block_size_tokens;
    const int64_t expected_blocks = out.input_tokens / block_size + (out.input_tokens % block_size != 0);
    if (static_cast<int64_t>(out.block_keys.size()) != expected_blocks) {
      return field_error("block count mismatch", "hash_ids",
                         fmt::format("has {} entries, expected ceil(input_length {} / block size {}) = {}{}",
                                     out.block_keys.size(), out.input_tokens, block_size, expected_blocks,
                                     options.length_divisor > 1
                                         ? fmt::format(" (lengths divided by {}: divide the block size too)",
                                                       options.length_divisor)
                                         : ""));
    }
    if (out.timestamp_ms < previous_timestamp_ms) {
      return field_error("timestamp went backwards", "timestamp",
                         fmt::format("{} is smaller than the previous request's {}", out.timestamp_ms,
                                     previous_timestamp_ms));
    }
    previous_timestamp_ms = out.timestamp_ms;
    return std::nullopt;
  }
};

void SkipReport::add(std::string_view reason, std::string message) {
  ++total_lines;
  for (Reason& r : reasons) {
    if (r.reason == reason) {
      ++r.lines;
      return;
    }
  }
  reasons.push_back(Reason{std::string(reason), 1, std::move(message)});
}

std::string SkipReport::summary() const {
  if (total_lines == 0) return "";
  std::string text = fmt::format("skipped {} invalid line{}:", total_lines, total_lines == 1 ? "" : "s");
  for (size_t i = 0; i < reasons.size(); ++i) {
    text += fmt::format("{} {} {} (first: {})", i == 0 ? "" : ",", reasons[i].lines, reasons[i].reason,
                        reasons[i].first_message);
  }
  return text;
}

TraceReader::TraceReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TraceReader::~TraceReader() = default;

Result<std::unique_ptr<TraceReader>> TraceReader::open(const std::string& path, ReadOptions options) {
  if (options.length_divisor < 1) {
    return Status::invalid_argument(
        fmt::format("length divisor must be >= 1, got {}", options.length_divisor));
  }
  if (options.block_size_tokens < 1) {
    return Status::invalid_argument(
        fmt::format("block size must be >= 1 token, got {}", options.block_size_tokens));
  }
  if (options.keys_from_token_ids && options.length_divisor != 1) {
    return Status::invalid_argument(
        fmt::format("block keys from token ids cannot be combined with a length divisor ({}): token ids "
                    "cannot be divided",
                    options.length_divisor));
  }
  auto lines = LineReader::open(path, kMaxLineBytes);
  if (!lines.ok()) return lines.status();
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->options = options;
  impl->lines = std::move(*lines);
  return std::unique_ptr<TraceReader>(new TraceReader(std::move(impl)));
}

Result<bool> TraceReader::next(Request& out) {
  Impl& s = *impl_;
  if (!s.failed.ok()) return s.failed;
  for (;;) {
    Result<bool> read = s.read_line();
    if (!read.ok()) {
      s.failed = read.status();
      return s.failed;
    }
    if (!*read) return false;
    if (!s.line_too_long && is_blank(s.line)) continue;
    std::optional<LineError> error = s.parse_line(out);
    if (!error) {
      out.line = s.line_number;
      return true;
    }
    if (!s.options.skip_invalid) {
      s.failed = Status::invalid_argument(std::move(error->message));
      return s.failed;
    }
    s.skipped.add(error->reason, std::move(error->message));
  }
}

const SkipReport& TraceReader::skipped() const {
  return impl_->skipped;
}

int64_t TraceReader::line_number() const {
  return impl_->line_number;
}

Status empty_trace_error(const std::string& path, const SkipReport& skipped) {
  if (skipped.total_lines == 0)
    return Status::invalid_argument(fmt::format("{}: the trace has no requests", path));
  return Status::invalid_argument(
      fmt::format("{}: the trace has no valid requests (all {} non-blank lines were "
                  "skipped as invalid)",
                  path, skipped.total_lines));
}

Result<std::vector<Request>> read_trace(const std::string& path, const ReadOptions& options,
                                        SkipReport* skipped) {
  Result<std::unique_ptr<TraceReader>> reader = TraceReader::open(path, options);
  if (!reader.ok()) return reader.status();
  std::vector<Request> requests;
  while (options.max_requests <= 0 || static_cast<int64_t>(requests.size()) < options.max_requests) {
    Request request;
    Result<bool> read = (*reader)->next(request);
    if (!read.ok()) return read.status();
    if (!*read) break;
    requests.push_back(std::move(request));
  }
  if (skipped != nullptr) *skipped = (*reader)->skipped();
  return requests;
}

}  // namespace crescent::trace
