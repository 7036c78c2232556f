// The C++ side of `schema/tests/cpp_interop.rs`.
//
// Built against `flatc --cpp` output for the *seed* schema
// (`schema/tests/seed/protocol.fbs` + `schema/base_types.fbs`), where
// `ToolResult.content: [Content]` is a real vector of unions. It stands in
// for a third-party client generated from the seed, so it uses only the
// generated API and the FlatBuffers library, nothing of ours.
//
// Usage:
//   interop encode-response FILE  write a size-prefixed Response/ToolResult
//   interop encode-request FILE   write a size-prefixed Request/ToolCall
//   interop dump-response FILE    verify a size-prefixed Response, print it
//
// The values written here are mirrored by constants in cpp_interop.rs; keep
// the two in step.

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "protocol_generated.h"

namespace fb = mcp::fbs::v1;
namespace proto = mcp::fbs::v1::protocol;

namespace {

// The seed's root_type is Request, so flatc generates no Response helpers;
// a client of the seed writes this one itself.
bool VerifySizePrefixedResponseBuffer(flatbuffers::Verifier &verifier) {
  return verifier.VerifySizePrefixedBuffer<proto::Response>(nullptr);
}

const uint8_t kResponseMessageId[16] = {0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77,
                                        0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff};
const uint8_t kToolCallId[16] = {0x0f, 0x0e, 0x0d, 0x0c, 0x0b, 0x0a, 0x09, 0x08,
                                 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, 0x00};
const uint8_t kRequestMessageId[16] = {0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0x46, 0xa7,
                                       0x88, 0xa9, 0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf};
const int64_t kTimestamp = 1700000000123456789;

// Non-ASCII, quotes, a backslash and control characters: the strings must
// cross unchanged, byte for byte.
const char kText[] = "h\xc3\xa9llo, \"w\xc3\xb6rld\"\\\n\t\x01 \xf0\x9f\xa6\x80";

bool WriteFile(const char *path, const uint8_t *data, size_t len) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char *>(data), static_cast<std::streamsize>(len));
  return static_cast<bool>(out);
}

bool ReadFile(const char *path, std::vector<uint8_t> *data) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  data->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return true;
}

int EncodeResponse(const char *path) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<uint8_t> types;
  std::vector<flatbuffers::Offset<void>> values;

  types.push_back(proto::Content_TextContent);
  values.push_back(proto::CreateTextContentDirect(fbb, kText).Union());
  types.push_back(proto::Content_ImageContent);
  values.push_back(proto::CreateImageContentDirect(fbb, "iVBORw0KGgo=", "image/png").Union());
  types.push_back(proto::Content_ResourceContent);
  values.push_back(
      proto::CreateResourceContentDirect(fbb, "file:///tmp/a.txt", "text/plain", "contents")
          .Union());

  std::vector<flatbuffers::Offset<fb::KeyValue>> metadata;
  metadata.push_back(fb::CreateKeyValueDirect(fbb, "attempt", "1"));
  metadata.push_back(fb::CreateKeyValueDirect(fbb, "router", "\"echo\""));

  fb::UUID tool_call_id(flatbuffers::span<const uint8_t, 16>(kToolCallId, 16));
  auto tr = proto::CreateToolResultDirect(fbb, &tool_call_id, /*success=*/true, &types, &values,
                                          /*error=*/0, &metadata, /*execution_time_ms=*/42);

  fb::UUID message_id(flatbuffers::span<const uint8_t, 16>(kResponseMessageId, 16));
  fb::Timestamp ts(kTimestamp);
  auto header = proto::CreateMessageHeaderDirect(fbb, proto::ProtocolVersion_V2025_06_18,
                                                 &message_id, &ts, "sess-1", "corr-42");
  auto root =
      proto::CreateResponse(fbb, header, proto::ResponsePayload_ToolResult, tr.Union(), true);
  fbb.FinishSizePrefixed(root);

  flatbuffers::Verifier v(fbb.GetBufferPointer(), fbb.GetSize());
  if (!VerifySizePrefixedResponseBuffer(v)) {
    std::cerr << "interop: own Response failed verification\n";
    return 1;
  }
  return WriteFile(path, fbb.GetBufferPointer(), fbb.GetSize()) ? 0 : 1;
}

int EncodeRequest(const char *path) {
  flatbuffers::FlatBufferBuilder fbb;
  // Insertion order, not sorted: the broker must not depend on order.
  std::vector<flatbuffers::Offset<fb::KeyValue>> args;
  args.push_back(fb::CreateKeyValueDirect(fbb, "city", "\"Z\xc3\xbcrich\""));
  args.push_back(fb::CreateKeyValueDirect(fbb, "days", "3"));
  args.push_back(fb::CreateKeyValueDirect(fbb, "opts", "{\"units\":\"metric\",\"hourly\":[1,2]}"));
  args.push_back(fb::CreateKeyValueDirect(fbb, "quote\"key", "null"));
  auto args_vec = fbb.CreateVector(args);

  fb::UUID id(flatbuffers::span<const uint8_t, 16>(kToolCallId, 16));
  fb::Timestamp ts(kTimestamp);
  auto call = proto::CreateToolCall(fbb, &id, fbb.CreateString("weather.forecast"), args_vec, &ts);

  fb::UUID message_id(flatbuffers::span<const uint8_t, 16>(kRequestMessageId, 16));
  // Version left at the seed's default (V2025_01_01): a seed client that
  // never heard of the extensions.
  auto header = proto::CreateMessageHeaderDirect(fbb, proto::ProtocolVersion_V2025_01_01,
                                                 &message_id, &ts, "sess-1", "corr-7");
  auto root = proto::CreateRequest(fbb, header, proto::RequestPayload_ToolCall, call.Union());
  proto::FinishSizePrefixedRequestBuffer(fbb, root);

  flatbuffers::Verifier v(fbb.GetBufferPointer(), fbb.GetSize());
  if (!proto::VerifySizePrefixedRequestBuffer(v)) {
    std::cerr << "interop: own Request failed verification\n";
    return 1;
  }
  return WriteFile(path, fbb.GetBufferPointer(), fbb.GetSize()) ? 0 : 1;
}

// Canonical quoting for the dump: `"`, `\` and bytes below 0x20 or 0x7f are
// escaped, everything else (UTF-8 included) is copied as is. Absent strings
// print as `null`. cpp_interop.rs implements the same rule.
std::string Q(const flatbuffers::String *s) {
  if (s == nullptr) return "null";
  std::string out = "\"";
  for (uint8_t c : s->string_view()) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string Hex(const fb::UUID *u) {
  if (u == nullptr) return "null";
  std::string out;
  char buf[3];
  for (uint8_t b : *u->bytes()) {
    std::snprintf(buf, sizeof buf, "%02x", b);
    out += buf;
  }
  return out;
}

const char *Bool(bool b) { return b ? "true" : "false"; }

int DumpResponse(const char *path) {
  std::vector<uint8_t> buf;
  if (!ReadFile(path, &buf)) {
    std::cerr << "interop: cannot read " << path << "\n";
    return 1;
  }
  flatbuffers::Verifier v(buf.data(), buf.size());
  if (!VerifySizePrefixedResponseBuffer(v)) {
    std::cerr << "interop: Response failed verification\n";
    return 2;
  }
  uint32_t prefix;
  std::memcpy(&prefix, buf.data(), 4);  // little-endian hosts only, as CI is
  const auto *resp = flatbuffers::GetSizePrefixedRoot<proto::Response>(buf.data());
  const auto *h = resp->header();
  std::ostringstream o;
  o << "size_prefix=" << prefix << " of " << buf.size() - 4 << "\n";
  o << "header.version=" << static_cast<int32_t>(h->version()) << "\n";
  o << "header.message_id=" << Hex(h->message_id()) << "\n";
  o << "header.timestamp=" << h->timestamp()->unix_nanos() << "\n";
  o << "header.session_id=" << Q(h->session_id()) << "\n";
  o << "header.correlation_id=" << Q(h->correlation_id()) << "\n";
  o << "success=" << Bool(resp->success()) << "\n";
  o << "payload_type=" << proto::EnumNameResponsePayload(resp->payload_type()) << "\n";
  const auto *tr = resp->payload_as_ToolResult();
  if (tr != nullptr) {
    o << "tool_result.tool_call_id=" << Hex(tr->tool_call_id()) << "\n";
    o << "tool_result.success=" << Bool(tr->success()) << "\n";
    const auto *types = tr->content_type();
    const auto *values = tr->content();
    const uint32_t n = types ? types->size() : 0;
    o << "tool_result.content.len=" << n << "\n";
    for (uint32_t i = 0; i < n; i++) {
      o << "tool_result.content[" << i << "]=";
      switch (types->Get(i)) {
        case proto::Content_TextContent: {
          const auto *c = values->GetAs<proto::TextContent>(i);
          o << "TextContent text=" << Q(c->text());
          break;
        }
        case proto::Content_ImageContent: {
          const auto *c = values->GetAs<proto::ImageContent>(i);
          o << "ImageContent data=" << Q(c->data()) << " mime_type=" << Q(c->mime_type());
          break;
        }
        case proto::Content_ResourceContent: {
          const auto *c = values->GetAs<proto::ResourceContent>(i);
          o << "ResourceContent uri=" << Q(c->uri()) << " mime_type=" << Q(c->mime_type())
            << " text=" << Q(c->text());
          break;
        }
        default:
          o << "Unknown tag=" << static_cast<int>(types->Get(i));
      }
      o << "\n";
    }
    if (tr->error() != nullptr) {
      o << "tool_result.error=" << tr->error()->code() << " " << Q(tr->error()->message()) << "\n";
    } else {
      o << "tool_result.error=null\n";
    }
    const auto *md = tr->metadata();
    const uint32_t m = md ? md->size() : 0;
    o << "tool_result.metadata.len=" << m << "\n";
    for (uint32_t i = 0; i < m; i++) {
      o << "tool_result.metadata[" << i << "]=" << Q(md->Get(i)->key()) << ":"
        << Q(md->Get(i)->value()) << "\n";
    }
    o << "tool_result.execution_time_ms=" << tr->execution_time_ms() << "\n";
  }
  const auto *er = resp->payload_as_ErrorResponse();
  if (er != nullptr) {
    o << "error.code=" << er->error()->code() << "\n";
    o << "error.message=" << Q(er->error()->message()) << "\n";
    o << "error.data=" << Q(er->error()->data()) << "\n";
  }
  std::cout << o.str();
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 3) {
    std::cerr << "usage: interop encode-response|encode-request|dump-response FILE\n";
    return 64;
  }
  const std::string cmd = argv[1];
  if (cmd == "encode-response") return EncodeResponse(argv[2]);
  if (cmd == "encode-request") return EncodeRequest(argv[2]);
  if (cmd == "dump-response") return DumpResponse(argv[2]);
  std::cerr << "interop: unknown command " << cmd << "\n";
  return 64;
}
