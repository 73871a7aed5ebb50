#include "trace/log_import.h"

#include <csv.h>
#include <date/date.h>
#include <fmt/format.h>
#include <zlib.h>

#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <streambuf>

#include "common/json_util.h"
#include "trace/line_reader.h"

namespace crescent::trace {

using nlohmann::json;

// Why a record is invalid: a short reason (the SkipReport key) and the full message. A fatal problem is the
// import's, not the record's (no tokenizer, no chat template): it stops the import even with skip_invalid.
struct LogImporter::Problem {
  std::string reason;
  std::string message;
  bool fatal = false;
};

namespace {

using Problem = LogImporter::Problem;
using Outcome = std::optional<Problem>;

// Far above any real request (a 1M-token prompt is ~4 MB of text); bounds memory on garbage input.
constexpr size_t kMaxRecordBytes = size_t{64} << 20;
// Records nesting deeper are refused before they are parsed into a tree (common/json_util.h); chat bodies
// nest 4 or 5 levels.
constexpr int kMaxJsonDepth = 64;
// A number's unit by its size (see log_import.h): seconds below 1e11, milliseconds below 1e14,
// microseconds below 1e17, nanoseconds above.
constexpr double kMillisecondsFrom = 1e11;
constexpr double kMicrosecondsFrom = 1e14;
constexpr double kNanosecondsFrom = 1e17;

// A JSON value as it appears in the log, cut short for messages.
std::string excerpt(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

Problem field_problem(std::string_view reason, std::string_view where, std::string_view field,
                      std::string_view problem) {
  return {std::string(reason), fmt::format("{}: field '{}': {}", where, field, problem)};
}

Result<int64_t> ms_from_number(double value) {
  if (!std::isfinite(value) || value < 0 || value > 9.2e18) {
    return Status::invalid_argument(fmt::format(
        "must be a time in Unix seconds, milliseconds, microseconds or nanoseconds, got {}", value));
  }
  const double ms = value >= kNanosecondsFrom    ? value / 1e6
                    : value >= kMicrosecondsFrom ? value / 1e3
                    : value >= kMillisecondsFrom ? value
                                                 : value * 1000.0;
  return static_cast<int64_t>(std::llround(ms));
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return text;
}

// An integer >= 0 written in `text` (a CSV cell): digits only, or a float with no fraction ("12.0").
std::optional<int64_t> parse_count(std::string_view text) {
  text = trim(text);
  int64_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error == std::errc() && end == text.data() + text.size() && value >= 0) return value;
  double number = 0;
  auto [fend, ferror] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (ferror == std::errc() && fend == text.data() + text.size() && number >= 0 && number < 9.2e18 &&
      number == std::floor(number)) {
    return static_cast<int64_t>(number);
  }
  return std::nullopt;
}

// An integer >= 0 in JSON `value`, or none.
std::optional<int64_t> json_count(const json& value) {
  if (value.is_number_unsigned()) {
    const uint64_t n = value.get<uint64_t>();
    if (n <= static_cast<uint64_t>(INT64_MAX)) return static_cast<int64_t>(n);
    return std::nullopt;
  }
  if (value.is_number_integer()) {
    const int64_t n = value.get<int64_t>();
    return n >= 0 ? std::optional(n) : std::nullopt;
  }
  return std::nullopt;
}

// A chat message's content as text: a string, or the text parts of an array of parts concatenated (the
// OpenAI API's [{"type": "text", "text": ...}]). Non-text parts (images, audio) cannot be tokenized here.
Outcome normalize_content(json& message, std::string_view where, std::string_view field) {
  json& content = message["content"];
  if (content.is_string()) return std::nullopt;
  if (!content.is_array()) {
    return field_problem("bad content", where, field,
                         fmt::format("must be a string or an array of text parts, got {}", excerpt(content)));
  }
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      return field_problem("non-text content", where, fmt::format("{}[{}]", field, i),
                           fmt::format("only text parts can be imported, got {}", excerpt(part)));
    }
    text += part["text"].get<std::string>();
  }
  content = text;
  return std::nullopt;
}

// Token ids of the chat `messages` (already checked to be an array of objects) through the chat template.
Outcome encode_messages(const PromptEncoder& encoder, const json& messages, std::string_view where,
                        std::string_view field, std::vector<int64_t>& ids) {
  if (!encoder.render_chat) {
    return Problem{
        "no chat template",
        fmt::format("{}: field '{}': chat messages need the model's chat template, and it has none "
                    "(give --model DIR whose tokenizer_config.json has a chat_template)",
                    where, field),
        true};
  }
  if (encoder.tokenizer == nullptr) {
    return Problem{
        "no tokenizer",
        fmt::format("{}: text prompts need a tokenizer: give --model DIR or --tokenizer FILE", where), true};
  }
  Result<std::string> text = encoder.render_chat(messages);
  if (!text.ok()) {
    return field_problem("chat template error", where, field,
                         fmt::format("the chat template refused them: {}", text.status().message()));
  }
  ids = encoder.tokenizer->encode(*text);
  return std::nullopt;
}

Outcome encode_text(const PromptEncoder& encoder, std::string_view text, std::string_view where,
                    std::vector<int64_t>& ids) {
  if (encoder.tokenizer == nullptr) {
    return Problem{
        "no tokenizer",
        fmt::format("{}: text prompts need a tokenizer: give --model DIR or --tokenizer FILE", where), true};
  }
  ids = encoder.tokenizer->encode(text);
  return std::nullopt;
}

// Checks `messages` (a field of a record) is an array of objects with a string role and text content (a
// string or text parts), and leaves each as {role, content}: what the server renders.
Outcome check_messages(json& messages, std::string_view where, std::string_view field) {
  if (!messages.is_array() || messages.empty()) {
    return field_problem("bad messages", where, field,
                         fmt::format("must be a non-empty array of messages, got {}", excerpt(messages)));
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    json& message = messages[i];
    const std::string name = fmt::format("{}[{}]", field, i);
    if (!message.is_object() || !message.contains("role") || !message["role"].is_string()) {
      return field_problem("bad messages", where, name,
                           fmt::format("must be an object with a string 'role', got {}", excerpt(message)));
    }
    if (auto problem = normalize_content(message, where, name + ".content")) return problem;
    // The template sees what the server's chat endpoint gives it (serve/openai_api.h): role and content.
    message = json{{"role", message["role"]}, {"content", message["content"]}};
  }
  return std::nullopt;
}

// token ids given in a record (`prompt_token_ids`, or a prompt of ids): non-empty, each >= 0.
Outcome read_token_ids(const json& value, std::string_view where, std::string_view field,
                       std::vector<int64_t>& ids) {
  if (!value.is_array() || value.empty()) {
    return field_problem("bad token ids", where, field,
                         fmt::format("must be a non-empty array of token ids, got {}", excerpt(value)));
  }
  ids.clear();
  ids.reserve(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    const std::optional<int64_t> id = json_count(value[i]);
    if (!id) {
      return field_problem("bad token ids", where, fmt::format("{}[{}]", field, i),
                           fmt::format("must be a token id (an integer >= 0), got {}", excerpt(value[i])));
    }
    ids.push_back(*id);
  }
  return std::nullopt;
}

// One line of an openai-log (see log_import.h) into `out`.
Outcome parse_openai_record(json record, const std::string& where, const PromptEncoder& encoder,
                            int64_t default_output_tokens, LoggedRequest& out) {
  if (record.is_discarded()) return Problem{"not JSON", where + ": not JSON"};
  if (!record.is_object()) {
    return Problem{"not an object", fmt::format("{}: not a JSON object, got {}", where, excerpt(record))};
  }
  if (!record.contains("timestamp")) return Problem{"missing field", where + ": missing field 'timestamp'"};
  Result<int64_t> timestamp = parse_timestamp_ms(record["timestamp"]);
  if (!timestamp.ok())
    return field_problem("bad timestamp", where, "timestamp", timestamp.status().message());
  out.timestamp_ms = *timestamp;

  const bool wrapped = record.contains("request");
  json& body = wrapped ? record["request"] : record;
  const std::string prefix = wrapped ? "request." : "";
  if (!body.is_object()) {
    return field_problem("bad request", where, "request",
                         fmt::format("must be an object, got {}", excerpt(body)));
  }
  out.token_ids.clear();
  if (record.contains("prompt_token_ids")) {
    if (auto problem = read_token_ids(record["prompt_token_ids"], where, "prompt_token_ids", out.token_ids)) {
      return problem;
    }
  } else if (body.contains("messages")) {
    json& messages = body["messages"];
    if (auto problem = check_messages(messages, where, prefix + "messages")) return problem;
    if (auto problem = encode_messages(encoder, messages, where, prefix + "messages", out.token_ids)) {
      return problem;
    }
  } else if (body.contains("prompt")) {
    const json& prompt = body["prompt"];
    const std::string field = prefix + "prompt";
    if (prompt.is_string()) {
      if (auto problem = encode_text(encoder, prompt.get_ref<const std::string&>(), where, out.token_ids)) {
        return problem;
      }
    } else if (prompt.is_array() && prompt.size() == 1 && (prompt[0].is_string() || prompt[0].is_array())) {
      // One prompt in a batch of one: ["text"] or [[ids]].
      if (prompt[0].is_string()) {
        if (auto problem =
                encode_text(encoder, prompt[0].get_ref<const std::string&>(), where, out.token_ids)) {
          return problem;
        }
      } else if (auto problem = read_token_ids(prompt[0], where, field + "[0]", out.token_ids)) {
        return problem;
      }
    } else if (prompt.is_array() && !prompt.empty() && (prompt[0].is_string() || prompt[0].is_array())) {
      return field_problem("several prompts", where, field,
                           fmt::format("holds {} prompts: one request per line, please", prompt.size()));
    } else if (auto problem = read_token_ids(prompt, where, field, out.token_ids)) {
      return problem;
    }
  } else {
    return Problem{"missing field",
                   fmt::format("{}: missing field '{}messages' or '{}prompt'", where, prefix, prefix)};
  }
  if (out.token_ids.empty()) return Problem{"empty prompt", where + ": the prompt has no tokens"};
  out.input_tokens = static_cast<int64_t>(out.token_ids.size());

  // Output length: what the response says, else what the request allowed, else the default.
  const json* usage = nullptr;
  std::string usage_field = "usage";
  if (record.contains("usage") && !record["usage"].is_null()) {
    usage = &record["usage"];
  } else if (record.contains("response") && record["response"].is_object() &&
             record["response"].contains("usage") && !record["response"]["usage"].is_null()) {
    usage = &record["response"]["usage"];
    usage_field = "response.usage";
  }
  out.output_tokens = default_output_tokens;
  if (usage != nullptr) {
    const json* completion =
        usage->is_object() && usage->contains("completion_tokens") ? &(*usage)["completion_tokens"] : nullptr;
    const std::optional<int64_t> tokens = completion ? json_count(*completion) : std::nullopt;
    if (!tokens) {
      return field_problem("bad usage", where, usage_field + ".completion_tokens",
                           fmt::format("must be an integer >= 0, got {}",
                                       completion ? excerpt(*completion) : excerpt(*usage)));
    }
    if (*tokens == 0) {
      return field_problem("no output", where, usage_field + ".completion_tokens",
                           "is 0: the request produced nothing (a failed or cancelled request?)");
    }
    out.output_tokens = *tokens;
  } else {
    for (const char* name : {"max_completion_tokens", "max_tokens"}) {
      if (!body.contains(name) || body[name].is_null()) continue;
      const std::optional<int64_t> tokens = json_count(body[name]);
      if (!tokens || *tokens == 0) {
        return field_problem("bad max_tokens", where, prefix + name,
                             fmt::format("must be an integer >= 1, got {}", excerpt(body[name])));
      }
      out.output_tokens = *tokens;
      break;
    }
  }

  out.session.reset();
  if (record.contains("session_id")) {
    const json& session = record["session_id"];
    if (session.is_string()) {
      out.session = session.get<std::string>();
    } else if (session.is_number_integer()) {
      out.session = session.dump();
    } else {
      return field_problem("bad session", where, "session_id",
                           fmt::format("must be a string or an integer, got {}", excerpt(session)));
    }
  } else if (body.contains("user") && body["user"].is_string()) {
    out.session = "user:" + body["user"].get<std::string>();
  }
  return std::nullopt;
}

// A std::streambuf over a gzip-or-plain file, for the JSON parser.
class GzStreamBuf : public std::streambuf {
 public:
  explicit GzStreamBuf(gzFile file) : file_(file) {}
  ~GzStreamBuf() override { gzclose(file_); }
  int64_t bytes_read() const { return static_cast<int64_t>(gzoffset(file_)); }
  bool failed() const {
    int code = Z_OK;
    gzerror(file_, &code);
    return code != Z_OK;
  }

 protected:
  int_type underflow() override {
    const int n = gzread(file_, buffer_, sizeof(buffer_));
    if (n <= 0) return traits_type::eof();
    setg(buffer_, buffer_, buffer_ + n);
    return traits_type::to_int_type(buffer_[0]);
  }

 private:
  gzFile file_;
  char buffer_[1 << 16];
};

// The chat role of a ShareGPT turn's "from".
std::optional<std::string> sharegpt_role(std::string_view from) {
  if (from == "human" || from == "user") return "user";
  if (from == "gpt" || from == "assistant" || from == "chatgpt" || from == "bard" || from == "bing" ||
      from == "model") {
    return "assistant";
  }
  if (from == "system") return "system";
  return std::nullopt;
}

// Thrown out of the JSON parser's callback to stop it at the first fatal problem.
struct StopParsing {
  Status status;
};

}  // namespace

struct LogImporter::Random {
  std::mt19937_64 engine;
};

std::optional<LogFormat> parse_log_format(std::string_view name) {
  if (name == "openai-log") return LogFormat::kOpenAiLog;
  if (name == "sharegpt") return LogFormat::kShareGpt;
  if (name == "csv") return LogFormat::kCsv;
  return std::nullopt;
}

Result<CsvColumns> parse_csv_columns(std::string_view spec) {
  if (spec == "azure") return CsvColumns{};
  if (spec == "burstgpt") return CsvColumns{"Timestamp", "Request tokens", "Response tokens", ""};
  CsvColumns columns{"", "", "", ""};
  size_t start = 0;
  while (start <= spec.size()) {
    const size_t comma = std::min(spec.find(',', start), spec.size());
    const std::string_view part = spec.substr(start, comma - start);
    start = comma + 1;
    const size_t equals = part.find('=');
    if (equals == std::string_view::npos || equals + 1 == part.size()) {
      return Status::invalid_argument(
          fmt::format("--columns: '{}' is not NAME=COLUMN (expected 'azure', 'burstgpt' or "
                      "timestamp=COL,input=COL,output=COL[,session=COL])",
                      part));
    }
    const std::string_view name = part.substr(0, equals);
    std::string column(part.substr(equals + 1));
    if (name == "timestamp") {
      columns.timestamp = column;
    } else if (name == "input") {
      columns.input_tokens = column;
    } else if (name == "output") {
      columns.output_tokens = column;
    } else if (name == "session") {
      columns.session = column;
    } else {
      return Status::invalid_argument(
          fmt::format("--columns: unknown name '{}' (expected timestamp, input, output or session)", name));
    }
  }
  for (auto [name, value] : {std::pair{"timestamp", &columns.timestamp},
                             {"input", &columns.input_tokens},
                             {"output", &columns.output_tokens}}) {
    if (value->empty()) return Status::invalid_argument(fmt::format("--columns: no '{}=COLUMN'", name));
  }
  return columns;
}

Result<int64_t> parse_timestamp_ms(std::string_view text) {
  text = trim(text);
  double number = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (error == std::errc() && end == text.data() + text.size()) return ms_from_number(number);
  // ISO 8601: date, 'T' or ' ', time with optional fraction, then 'Z', an offset or nothing (UTC). Years
  // 1970..2200 (nanosecond time points end in 2262).
  std::string iso(text);
  const auto year_too_late = [&] {
    int year = 0;
    const auto [end, error] = std::from_chars(iso.data(), iso.data() + std::min<size_t>(iso.size(), 4), year);
    return error == std::errc() && end == iso.data() + 4 && year > 2200;
  };
  if (year_too_late()) return Status::invalid_argument(fmt::format("must be before 2200, got '{}'", text));
  if (iso.size() > 10 && iso[10] == ' ') iso[10] = 'T';
  bool has_offset = false;
  if (!iso.empty() && (iso.back() == 'Z' || iso.back() == 'z')) {
    iso.pop_back();
  } else if (iso.size() > 19) {
    const size_t sign = iso.find_last_of("+-");
    has_offset = sign != std::string::npos && sign > 18;
    // "+0100" (strftime's %z) as "+01:00"; then the offset must be a real one, within ±18:00.
    if (has_offset && iso.size() - sign == 5 && iso.find(':', sign) == std::string::npos)
      iso.insert(sign + 3, ":");
    if (has_offset) {
      int hours = -1, minutes = -1;
      if (iso.size() - sign == 6 && iso[sign + 3] == ':') {
        std::from_chars(iso.data() + sign + 1, iso.data() + sign + 3, hours);
        std::from_chars(iso.data() + sign + 4, iso.data() + sign + 6, minutes);
      }
      if (hours < 0 || hours > 18 || minutes < 0 || minutes > 59) {
        return Status::invalid_argument(
            fmt::format("has an offset that is not ±hh:mm within ±18:00: '{}'", text));
      }
    }
  }
  // A fraction longer than nanoseconds would not parse: keep 9 digits.
  const size_t dot = iso.find('.', 19);
  if (dot != std::string::npos) {
    size_t digits_end = dot + 1;
    while (digits_end < iso.size() && std::isdigit(static_cast<unsigned char>(iso[digits_end]))) ++digits_end;
    if (digits_end - dot - 1 > 9) iso.erase(dot + 10, digits_end - dot - 10);
  }
  std::istringstream in(iso);
  date::sys_time<std::chrono::nanoseconds> time;
  if (has_offset) {
    in >> date::parse("%FT%T%Ez", time);
  } else {
    in >> date::parse("%FT%T", time);
  }
  if (in.fail() || in.peek() != std::char_traits<char>::eof()) {
    return Status::invalid_argument(fmt::format(
        "must be an ISO 8601 date-time (2026-12-03T07:00:00.250Z) or a Unix time (s, ms, us or ns), got '{}'",
        text.size() > 40 ? std::string(text.substr(0, 37)) + "..." : std::string(text)));
  }
  const int64_t ms = std::chrono::duration_cast<std::chrono::milliseconds>(time.time_since_epoch()).count();
  if (ms < 0) return Status::invalid_argument(fmt::format("must be after 1970, got '{}'", text));
  return ms;
}

Result<int64_t> parse_timestamp_ms(const json& value) {
  if (value.is_number()) return ms_from_number(value.get<double>());
  if (value.is_string()) return parse_timestamp_ms(std::string_view(value.get_ref<const std::string&>()));
  return Status::invalid_argument(
      fmt::format("must be an ISO 8601 date-time string or a number of Unix seconds or milliseconds, got {}",
                  excerpt(value)));
}

LogImporter::LogImporter(LogImportOptions options, PromptEncoder encoder, TraceImporter& importer)
    : options_(std::move(options)),
      encoder_(std::move(encoder)),
      importer_(importer),
      random_(std::make_unique<Random>(Random{std::mt19937_64(options_.seed)})) {}

LogImporter::~LogImporter() = default;

Status LogImporter::on_problem(Problem problem) {
  if (problem.fatal || !options_.skip_invalid) return Status::invalid_argument(std::move(problem.message));
  skipped_.add(problem.reason, std::move(problem.message));
  return Status();
}

Status LogImporter::read(const std::string& path) {
  switch (options_.format) {
    case LogFormat::kOpenAiLog:
      return read_openai_log(path);
    case LogFormat::kShareGpt:
      return read_sharegpt(path);
    case LogFormat::kCsv:
      return read_csv(path);
  }
  return Status::invalid_argument("unknown log format");
}

Status LogImporter::each_line(const std::string& path, bool json_lines,
                              const std::function<Status(std::string& line, int64_t line_number)>& on_line) {
  auto reader = LineReader::open(path, kMaxRecordBytes);
  if (!reader.ok()) return reader.status();
  LineReader& lines = **reader;
  for (;;) {
    Result<bool> more = lines.next();
    if (!more.ok()) return Status::io_error(fmt::format("{}: {}", path, more.status().message()));
    if (!*more) return Status();
    const int64_t number = lines.line_number();
    if (lines.line_too_long()) {
      CRESCENT_RETURN_IF_ERROR(on_problem(
          {"line too long", fmt::format("{}:{}: line longer than {} bytes", path, number, kMaxRecordBytes)}));
    } else if (json_lines && trim(lines.line()).empty()) {
      continue;
    } else if (json_lines && json_depth_exceeds(lines.line(), kMaxJsonDepth)) {
      CRESCENT_RETURN_IF_ERROR(on_problem(
          {"too deep", fmt::format("{}:{}: nests deeper than {} levels", path, number, kMaxJsonDepth)}));
    } else {
      CRESCENT_RETURN_IF_ERROR(on_line(lines.line(), number));
    }
    if (options_.progress) options_.progress(lines.file_bytes_read());
  }
}

Status LogImporter::add_in_window(LoggedRequest request) {
  const int64_t arrival_ms = request.timestamp_ms;
  if (Status added = importer_.add(std::move(request)); !added.ok()) {
    return on_problem({"out of order", added.message()});
  }
  latest_ms_ = std::max(latest_ms_, arrival_ms);
  return importer_.release_before(latest_ms_ - options_.reorder_window_ms);
}

Status LogImporter::read_openai_log(const std::string& path) {
  return each_line(path, /*json_lines=*/true, [&](std::string& line, int64_t number) {
    LoggedRequest request;
    request.where = fmt::format("{}:{}", path, number);
    Outcome problem = parse_openai_record(json::parse(line, nullptr, false), request.where, encoder_,
                                          options_.default_output_tokens, request);
    if (problem) return on_problem(std::move(*problem));
    return add_in_window(std::move(request));
  });
}

Status LogImporter::add_conversation(const json& conversation, const std::string& where,
                                     const std::string& session) {
  // The conversation as OpenAI messages.
  if (!conversation.is_object()) {
    return on_problem(
        {"not an object", fmt::format("{}: not a JSON object, got {}", where, excerpt(conversation))});
  }
  json messages = json::array();
  if (conversation.contains("conversations")) {
    const json& turns = conversation["conversations"];
    if (!turns.is_array()) {
      return on_problem(field_problem("bad conversation", where, "conversations",
                                      fmt::format("must be an array of turns, got {}", excerpt(turns))));
    }
    for (size_t i = 0; i < turns.size(); ++i) {
      const json& turn = turns[i];
      const std::string field = fmt::format("conversations[{}]", i);
      if (!turn.is_object() || !turn.contains("from") || !turn["from"].is_string() ||
          !turn.contains("value") || !turn["value"].is_string()) {
        return on_problem(
            field_problem("bad turn", where, field,
                          fmt::format("must be {{\"from\": ..., \"value\": TEXT}}, got {}", excerpt(turn))));
      }
      const std::optional<std::string> role = sharegpt_role(turn["from"].get_ref<const std::string&>());
      if (!role) {
        return on_problem(field_problem(
            "unknown speaker", where, field + ".from",
            fmt::format("must be human, gpt or system (or user, assistant), got {}", excerpt(turn["from"]))));
      }
      messages.push_back({{"role", *role}, {"content", turn["value"]}});
    }
  } else if (conversation.contains("messages")) {
    messages = conversation["messages"];
    if (auto problem = check_messages(messages, where, "messages")) return on_problem(std::move(*problem));
  } else {
    return on_problem({"missing field", where + ": missing field 'conversations' (or 'messages')"});
  }

  // The conversation's start: Poisson arrivals. Nothing later can arrive before it.
  const double start_s = next_session_start_s_;
  std::exponential_distribution<double> gap(options_.session_rate_per_s);
  next_session_start_s_ += gap(random_->engine);
  const int64_t start_ms = static_cast<int64_t>(std::llround(start_s * 1000.0));
  CRESCENT_RETURN_IF_ERROR(importer_.release_before(start_ms));

  // Each user turn a request: the conversation so far, rendered with the generation prompt.
  int64_t turn = 0;
  std::vector<LoggedRequest> requests;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i]["role"] != "user") continue;
    LoggedRequest request;
    request.where = fmt::format("{} turn {}", where, i);
    request.timestamp_ms =
        start_ms +
        static_cast<int64_t>(std::llround(static_cast<double>(turn) * options_.think_time_s * 1000.0));
    request.session = session;
    const json so_far(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    if (auto problem =
            encode_messages(encoder_, so_far, where, fmt::format("messages[{}]", i), request.token_ids)) {
      return on_problem(std::move(*problem));
    }
    request.input_tokens = static_cast<int64_t>(request.token_ids.size());
    request.output_tokens = options_.default_output_tokens;
    if (i + 1 < messages.size() && messages[i + 1]["role"] == "assistant" &&
        messages[i + 1]["content"].is_string()) {
      const auto& answer = messages[i + 1]["content"].get_ref<const std::string&>();
      if (!answer.empty()) {
        request.output_tokens =
            std::max<int64_t>(1, static_cast<int64_t>(encoder_.tokenizer->encode(answer).size()));
      }
    }
    requests.push_back(std::move(request));
    ++turn;
  }
  if (requests.empty()) return on_problem({"no user turn", where + ": the conversation has no user turn"});
  for (LoggedRequest& request : requests) CRESCENT_RETURN_IF_ERROR(importer_.add(std::move(request)));
  return Status();
}

Status LogImporter::read_sharegpt(const std::string& path) {
  // A JSON array of conversations, or JSONL: the first character that is not white space says which (a
  // first line too long to hold is a JSON array on one line).
  {
    auto reader = LineReader::open(path, kMaxRecordBytes);
    if (!reader.ok()) return reader.status();
    bool jsonl = false;
    for (;;) {
      Result<bool> more = (*reader)->next();
      if (!more.ok()) return Status::io_error(fmt::format("{}: {}", path, more.status().message()));
      if (!*more) return Status::invalid_argument(fmt::format("{}: the log has no conversations", path));
      const std::string_view line = trim((*reader)->line());
      if ((*reader)->line_too_long() || !line.empty()) {
        jsonl = !(*reader)->line_too_long() && line.front() != '[';
        break;
      }
    }
    if (jsonl) {
      return each_line(path, /*json_lines=*/true, [&](std::string& line, int64_t number) {
        const std::string where = fmt::format("{}:{}", path, number);
        const json conversation = json::parse(line, nullptr, false);
        if (conversation.is_discarded()) return on_problem({"not JSON", where + ": not JSON"});
        return add_conversation(conversation, where, fmt::format("{}#{}", path, conversations_++));
      });
    }
  }
  // A JSON array: parsed as a stream, each conversation handled and dropped as soon as it is complete.
  errno = 0;
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr)
    return Status::io_error(fmt::format("cannot open '{}': {}", path, std::strerror(errno)));
  gzbuffer(file, 1 << 16);
  GzStreamBuf buffer(file);
  std::istream in(&buffer);
  int64_t index = 0;
  auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 0 && event == json::parse_event_t::value && !parsed.is_array()) {
      throw StopParsing{Status::invalid_argument(
          fmt::format("{}: must be a JSON array of conversations (or JSONL, one a line), got {}", path,
                      excerpt(parsed)))};
    }
    if (depth > kMaxJsonDepth) {
      throw StopParsing{Status::invalid_argument(
          fmt::format("{}: conversation {} nests deeper than {} levels", path, index, kMaxJsonDepth))};
    }
    if (depth != 1 || (event != json::parse_event_t::object_end && event != json::parse_event_t::array_end &&
                       event != json::parse_event_t::value)) {
      return true;
    }
    // One element of the top-level array is complete.
    const std::string where = fmt::format("{}: conversation {}", path, index++);
    Status status = add_conversation(parsed, where, fmt::format("{}#{}", path, conversations_++));
    if (!status.ok()) throw StopParsing{std::move(status)};
    if (options_.progress) options_.progress(buffer.bytes_read());
    return false;  // drop it: memory stays one conversation
  };
  try {
    const json rest = json::parse(in, on_event);  // the top-level array, every conversation dropped
  } catch (const StopParsing& stop) {
    return stop.status;
  } catch (const json::parse_error& error) {
    if (buffer.failed()) return Status::io_error(fmt::format("{}: corrupt or truncated gzip stream", path));
    return Status::invalid_argument(fmt::format("{}: not JSON at byte {} (after conversation {}): {}", path,
                                                error.byte, index, error.what()));
  }
  return Status();
}

Status LogImporter::read_csv(const std::string& path) {
  struct Row {
    std::vector<std::string> cells;
    std::vector<std::vector<std::string>> complete;  // rows completed by the last chunk
  } row;
  csv_parser parser;
  // Strict: a quote inside an unquoted cell, or a quoted cell never closed, is an error, not data.
  if (csv_init(&parser, CSV_STRICT | CSV_STRICT_FINI | CSV_APPEND_NULL) != 0) {
    return Status::io_error("cannot start the CSV parser");
  }
  struct ParserFree {
    csv_parser* parser;
    ~ParserFree() { csv_free(parser); }
  } free_parser{&parser};
  auto on_cell = [](void* data, size_t length, void* user) {
    static_cast<Row*>(user)->cells.emplace_back(static_cast<const char*>(data), length);
  };
  auto on_row = [](int, void* user) {
    Row& r = *static_cast<Row*>(user);
    r.complete.push_back(std::move(r.cells));
    r.cells.clear();
  };
  std::vector<std::string> header;
  int timestamp_column = -1, input_column = -1, output_column = -1, session_column = -1;
  auto handle_row = [&](std::vector<std::string>& cells, int64_t line) -> Status {
    const std::string where = fmt::format("{}:{}", path, line);
    if (header.empty()) {
      header = cells;
      auto find = [&](const std::string& name) -> int {
        for (size_t i = 0; i < header.size(); ++i) {
          if (trim(header[i]) == name) return static_cast<int>(i);
        }
        return -1;
      };
      const CsvColumns& columns = options_.csv_columns;
      for (auto [name, column] : {std::pair{&columns.timestamp, &timestamp_column},
                                  {&columns.input_tokens, &input_column},
                                  {&columns.output_tokens, &output_column},
                                  {&columns.session, &session_column}}) {
        if (name->empty()) continue;
        *column = find(*name);
        if (*column < 0) {
          std::string names;
          for (const std::string& h : header) names += fmt::format("{}'{}'", names.empty() ? "" : ", ", h);
          return Status::invalid_argument(
              fmt::format("{}: the header has no column '{}' (it has {}): name the columns with --columns",
                          where, *name, names));
        }
      }
      return Status();
    }
    if (cells.size() == 1 && trim(cells[0]).empty()) return Status();  // a blank line
    if (cells.size() != header.size()) {
      return on_problem({"wrong cell count",
                         fmt::format("{}: {} cells, the header has {}", where, cells.size(), header.size())});
    }
    LoggedRequest request;
    request.where = where;
    Result<int64_t> timestamp =
        parse_timestamp_ms(std::string_view(cells[static_cast<size_t>(timestamp_column)]));
    if (!timestamp.ok()) {
      return on_problem(field_problem("bad timestamp", where, header[static_cast<size_t>(timestamp_column)],
                                      timestamp.status().message()));
    }
    request.timestamp_ms = *timestamp;
    for (auto [column, out] :
         {std::pair{input_column, &request.input_tokens}, {output_column, &request.output_tokens}}) {
      const std::string& cell = cells[static_cast<size_t>(column)];
      const std::optional<int64_t> count = parse_count(cell);
      if (!count || *count == 0) {
        return on_problem(field_problem(count ? "zero length" : "bad length", where,
                                        header[static_cast<size_t>(column)],
                                        fmt::format("must be an integer >= 1, got '{}'",
                                                    cell.size() > 40 ? cell.substr(0, 37) + "..." : cell)));
      }
      *out = *count;
    }
    if (session_column >= 0) {  // an empty cell: no session (not one session of everyone without one)
      const std::string_view session = trim(cells[static_cast<size_t>(session_column)]);
      if (!session.empty()) request.session = std::string(session);
    }
    return add_in_window(std::move(request));
  };
  // A row may span lines (a quoted cell holding a newline): messages name the line it starts on, and its
  // bytes are bounded like a line's.
  int64_t row_start = 1;
  size_t row_bytes = 0;
  CRESCENT_RETURN_IF_ERROR(each_line(path, /*json_lines=*/false, [&](std::string& line, int64_t number) {
    line.push_back('\n');
    row_bytes += line.size();
    if (csv_parse(&parser, line.data(), line.size(), on_cell, on_row, &row) != line.size()) {
      return Status::invalid_argument(
          fmt::format("{}:{}: not CSV: {}", path, row_start, csv_strerror(csv_error(&parser))));
    }
    if (row.complete.empty() && row_bytes > kMaxRecordBytes) {
      return Status::invalid_argument(
          fmt::format("{}:{}: a row longer than {} bytes (a quoted cell never closed?)", path, row_start,
                      kMaxRecordBytes));
    }
    for (auto& cells : row.complete) CRESCENT_RETURN_IF_ERROR(handle_row(cells, row_start));
    if (!row.complete.empty()) {
      row.complete.clear();
      row_start = number + 1;
      row_bytes = 0;
    }
    return Status();
  }));
  if (csv_fini(&parser, on_cell, on_row, &row) != 0) {
    return Status::invalid_argument(fmt::format(
        "{}:{}: a quoted cell is never closed (the row starting here runs to the end of the file)", path,
        row_start));
  }
  for (auto& cells : row.complete) CRESCENT_RETURN_IF_ERROR(handle_row(cells, row_start));
  if (header.empty()) return Status::invalid_argument(fmt::format("{}: the CSV has no header row", path));
  return Status();
}

}  // namespace crescent::trace
