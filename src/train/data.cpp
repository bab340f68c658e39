// Token files, the byte and FASTA codon tokenizers, and the packing, shuffling loader
// (data.h). Trainer layer (host code).
#include "sciattn/train/data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "sciattn/train/random.h"

namespace sciattn::train {
namespace {

void put_u32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint32_t get_u32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t get_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

int base_index(char ch) {
  switch (ch) {
    case 'A':
    case 'a':
      return 0;
    case 'C':
    case 'c':
      return 1;
    case 'G':
    case 'g':
      return 2;
    case 'T':
    case 't':
    case 'U':
    case 'u':
      return 3;
    default:
      return -1;
  }
}

}  // namespace

const char* tokenizer_name(Tokenizer t) {
  switch (t) {
    case Tokenizer::kUnspecified:
      return "unspecified";
    case Tokenizer::kBytes:
      return "bytes";
    case Tokenizer::kCodons:
      return "codons";
  }
  return "?";
}

std::vector<int32_t> tokenize_bytes(std::string_view text) {
  std::vector<int32_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

Status tokenize_fasta(std::string_view text, std::vector<std::vector<int32_t>>* documents,
                      FastaStats* stats) {
  *stats = FastaStats{};
  documents->clear();
  bool in_record = false;
  std::vector<int32_t> doc;
  std::vector<int> bases;  // of the current record: 0..3, or -1 for another letter
  auto finish_record = [&]() {
    if (!in_record) return;
    ++stats->records;
    const size_t whole = bases.size() / 3 * 3;
    stats->dropped_bases += static_cast<int64_t>(bases.size() - whole);
    doc.clear();
    for (size_t i = 0; i < whole; i += 3) {
      if (bases[i] < 0 || bases[i + 1] < 0 || bases[i + 2] < 0) {
        doc.push_back(kCodonUnknown);
        ++stats->unknown_codons;
      } else {
        doc.push_back(16 * bases[i] + 4 * bases[i + 1] + bases[i + 2]);
      }
    }
    stats->codons += static_cast<int64_t>(doc.size());
    if (doc.empty()) {
      ++stats->empty_records;
    } else {
      documents->push_back(doc);
    }
    bases.clear();
  };
  int64_t line_number = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!line.empty() && (line[0] == '>' || line[0] == ';')) {
      if (line[0] == '>') {
        finish_record();
        in_record = true;
      }
      continue;  // a header, or an old-style comment
    }
    for (char ch : line) {
      if (ch == ' ' || ch == '\t') continue;
      if (!in_record) {
        return Status::invalid_argument("FASTA line " + std::to_string(line_number) +
                                        ": sequence text before the first \">\" header");
      }
      const bool letter = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z');
      if (!letter && ch != '*' && ch != '-') {
        return Status::invalid_argument("FASTA line " + std::to_string(line_number) +
                                        ": character '" + std::string(1, ch) +
                                        "' is not a base (letters, '*' or '-')");
      }
      bases.push_back(base_index(ch));
    }
  }
  finish_record();
  return Status::ok_status();
}

Status write_token_file(const std::string& path, const std::vector<std::vector<int32_t>>& documents,
                        uint64_t vocab_size, uint32_t separator, Tokenizer tokenizer) {
  if (vocab_size < 2 || vocab_size > (uint64_t{1} << 32)) {
    return Status::invalid_argument("token file: vocabulary size must be in [2, 2^32]; got " +
                                    std::to_string(vocab_size));
  }
  if (separator != kNoSeparator && separator >= vocab_size) {
    return Status::invalid_argument("token file: separator " + std::to_string(separator) +
                                    " is outside the vocabulary [0, " + std::to_string(vocab_size) +
                                    ")");
  }
  const uint32_t width = vocab_size <= 65536 ? 2 : 4;
  uint64_t tokens = 0;
  for (size_t d = 0; d < documents.size(); ++d) {
    for (size_t i = 0; i < documents[d].size(); ++i) {
      const int32_t t = documents[d][i];
      if (t < 0 || static_cast<uint64_t>(t) >= vocab_size) {
        return Status::invalid_argument("token file: document " + std::to_string(d) +
                                        ", position " + std::to_string(i) + ": token " +
                                        std::to_string(t) + " is outside the vocabulary [0, " +
                                        std::to_string(vocab_size) + ")");
      }
    }
    tokens += documents[d].size() + (separator != kNoSeparator ? 1 : 0);
  }
  unsigned char header[kTokenFileHeaderBytes] = {};
  std::memcpy(header, kTokenFileMagic, 8);
  put_u32(header + 8, kTokenFileVersion);
  put_u32(header + 12, width);
  put_u64(header + 16, vocab_size);
  put_u64(header + 24, tokens);
  put_u64(header + 32, documents.size());
  put_u32(header + 40, separator);
  put_u32(header + 44, static_cast<uint32_t>(tokenizer));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    return Status::invalid_argument("cannot write \"" + path + "\": " + std::strerror(errno));
  }
  out.write(reinterpret_cast<const char*>(header), sizeof header);
  std::vector<unsigned char> buffer;
  auto emit = [&](uint32_t t) {
    for (uint32_t i = 0; i < width; ++i) buffer.push_back(static_cast<unsigned char>(t >> (8 * i)));
  };
  for (const auto& doc : documents) {
    buffer.clear();
    for (int32_t t : doc) emit(static_cast<uint32_t>(t));
    if (separator != kNoSeparator) emit(separator);
    out.write(reinterpret_cast<const char*>(buffer.data()),
              static_cast<std::streamsize>(buffer.size()));
  }
  out.flush();
  if (!out) {
    return Status::invalid_argument("cannot write \"" + path + "\": " + std::strerror(errno));
  }
  return Status::ok_status();
}

TokenFile::~TokenFile() {
  if (map_ != nullptr) munmap(const_cast<unsigned char*>(map_), map_bytes_);
}

Status TokenFile::open(const std::string& path, std::unique_ptr<TokenFile>* out) {
  const std::string what = "token file \"" + path + "\"";
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return Status::invalid_argument("cannot read " + what + ": " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::invalid_argument("cannot read " + what + ": " + std::strerror(err));
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  if (bytes < kTokenFileHeaderBytes) {
    ::close(fd);
    return Status::invalid_argument(what + " is " + std::to_string(bytes) +
                                    " bytes, shorter than the 64-byte header (make one with "
                                    "`sciattn data`)");
  }
  void* map = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) {
    return Status::invalid_argument("cannot map " + what + ": " + std::strerror(errno));
  }
  std::unique_ptr<TokenFile> f(new TokenFile());
  f->path_ = path;
  f->map_ = static_cast<const unsigned char*>(map);
  f->map_bytes_ = bytes;
  const unsigned char* h = f->map_;
  if (std::memcmp(h, kTokenFileMagic, 8) != 0) {
    return Status::invalid_argument(what +
                                    " does not start with the magic \"SCIATOKN\" (make "
                                    "one with `sciattn data`)");
  }
  TokenFileHeader& hd = f->header_;
  hd.version = get_u32(h + 8);
  hd.token_bytes = get_u32(h + 12);
  hd.vocab_size = get_u64(h + 16);
  hd.num_tokens = get_u64(h + 24);
  hd.num_documents = get_u64(h + 32);
  hd.separator = get_u32(h + 40);
  hd.tokenizer = static_cast<Tokenizer>(get_u32(h + 44));
  if (hd.version != kTokenFileVersion) {
    return Status::invalid_argument(what + " has version " + std::to_string(hd.version) +
                                    "; this build reads version 1");
  }
  if (hd.token_bytes != 2 && hd.token_bytes != 4) {
    return Status::invalid_argument(what + " has token width " + std::to_string(hd.token_bytes) +
                                    " bytes; it must be 2 or 4");
  }
  if (hd.vocab_size < 2 || hd.vocab_size > (uint64_t{1} << 32)) {
    return Status::invalid_argument(what + " has vocabulary size " + std::to_string(hd.vocab_size) +
                                    "; it must be in [2, 2^32]");
  }
  const uint64_t body = bytes - kTokenFileHeaderBytes;
  if (hd.num_tokens > body / hd.token_bytes || body != hd.num_tokens * hd.token_bytes) {
    return Status::invalid_argument(what + " says it holds " + std::to_string(hd.num_tokens) +
                                    " tokens of " + std::to_string(hd.token_bytes) +
                                    " bytes, but " + std::to_string(body) +
                                    " bytes follow the header");
  }
  *out = std::move(f);
  return Status::ok_status();
}

void TokenFile::read(uint64_t start, uint64_t count, int32_t* out) const {
  const unsigned char* p = map_ + kTokenFileHeaderBytes + start * header_.token_bytes;
  if (header_.token_bytes == 2) {
    for (uint64_t i = 0; i < count; ++i) {
      out[i] = static_cast<int32_t>(p[2 * i] | (p[2 * i + 1] << 8));
    }
  } else {
    for (uint64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(get_u32(p + 4 * i));
  }
}

Status DataLoader::create(const TokenFile* file, int64_t sequence_length, int64_t batch,
                          int64_t model_vocab, bool shuffle, uint64_t seed,
                          std::unique_ptr<DataLoader>* out) {
  const TokenFileHeader& h = file->header();
  const std::string what = "token file \"" + file->path() + "\"";
  if (h.vocab_size > static_cast<uint64_t>(model_vocab)) {
    return Status::invalid_argument(what + " has vocabulary size " + std::to_string(h.vocab_size) +
                                    ", larger than the model's "
                                    "vocab_size " +
                                    std::to_string(model_vocab));
  }
  const uint64_t L = static_cast<uint64_t>(sequence_length);
  const uint64_t samples = h.num_tokens > L ? (h.num_tokens - 1) / L : 0;
  if (samples < static_cast<uint64_t>(batch)) {
    return Status::invalid_argument(
        what + " holds " + std::to_string(h.num_tokens) + " tokens: " + std::to_string(samples) +
        " samples of sequence_length + 1 = " + std::to_string(L + 1) +
        " tokens, fewer than one micro-batch of " + std::to_string(batch));
  }
  std::unique_ptr<DataLoader> d(new DataLoader());
  d->file_ = file;
  d->length_ = sequence_length;
  d->batch_ = batch;
  d->shuffle_ = shuffle;
  d->samples_ = samples;
  d->position_.seed = seed;
  d->window_.resize(L + 1);
  d->start_epoch();
  *out = std::move(d);
  return Status::ok_status();
}

void DataLoader::start_epoch() {
  order_.resize(samples_);
  for (uint64_t i = 0; i < samples_; ++i) order_[i] = i;
  if (!shuffle_) return;
  Rng rng(position_.seed + position_.epoch * 0x9E3779B97F4A7C15ULL);
  for (uint64_t i = samples_ - 1; i > 0; --i) std::swap(order_[i], order_[rng.below(i + 1)]);
}

Status DataLoader::set_position(const DataPosition& p) {
  if (p.cursor > samples_) {
    return Status::invalid_argument("data position " + std::to_string(p.cursor) +
                                    " is past the epoch's " + std::to_string(samples_) +
                                    " samples: the checkpoint belongs to another data file or "
                                    "sequence length");
  }
  position_ = p;
  start_epoch();
  return Status::ok_status();
}

void DataLoader::next(int32_t* inputs, int32_t* targets) {
  const uint64_t L = static_cast<uint64_t>(length_);
  for (int64_t b = 0; b < batch_; ++b) {
    if (position_.cursor == samples_) {
      ++position_.epoch;
      position_.cursor = 0;
      start_epoch();
    }
    const uint64_t sample = order_[position_.cursor++];
    file_->read(sample * L, L + 1, window_.data());
    std::memcpy(inputs + b * length_, window_.data(), L * sizeof(int32_t));
    std::memcpy(targets + b * length_, window_.data() + 1, L * sizeof(int32_t));
  }
}

void DataLoader::skip(int64_t micro_batches) {
  uint64_t left =
      static_cast<uint64_t>(std::max<int64_t>(micro_batches, 0)) * static_cast<uint64_t>(batch_);
  while (left > 0) {
    if (position_.cursor == samples_) {
      ++position_.epoch;
      position_.cursor = 0;
      start_epoch();
    }
    const uint64_t take = std::min(left, samples_ - position_.cursor);
    position_.cursor += take;
    left -= take;
  }
}

}  // namespace sciattn::train
