// Training data: the token file format, the byte and codon tokenizers (`sciattn data`), and the
// loader that packs the token stream into sequences and shuffles them with a seed. Public API of
// the trainer (plain C++17).
//
// Token file (little-endian throughout), a 64-byte header then the tokens:
//   offset  0  8 bytes  magic "SCIATOKN"
//           8  u32      version (1)
//          12  u32      token width in bytes: 2 or 4 (unsigned)
//          16  u64      vocabulary size V (every token is < V)
//          24  u64      number of tokens N
//          32  u64      number of documents
//          40  u32      document separator token, or 0xFFFFFFFF for none
//          44  u32      tokenizer: 0 unspecified, 1 bytes, 2 codons
//          48  16 bytes zero (reserved)
//          64  N tokens of the given width
// Each document's tokens are followed by the separator, so the file is doc SEP doc SEP ... .
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sciattn/status.h"

namespace sciattn::train {

inline constexpr char kTokenFileMagic[8] = {'S', 'C', 'I', 'A', 'T', 'O', 'K', 'N'};
inline constexpr uint32_t kTokenFileVersion = 1;
inline constexpr size_t kTokenFileHeaderBytes = 64;
inline constexpr uint32_t kNoSeparator = 0xFFFFFFFFu;

enum class Tokenizer : uint32_t { kUnspecified = 0, kBytes = 1, kCodons = 2 };
const char* tokenizer_name(Tokenizer t);  // "unspecified", "bytes", "codons"

struct TokenFileHeader {
  uint32_t version = kTokenFileVersion;
  uint32_t token_bytes = 2;
  uint64_t vocab_size = 0;
  uint64_t num_tokens = 0;
  uint64_t num_documents = 0;
  uint32_t separator = kNoSeparator;
  Tokenizer tokenizer = Tokenizer::kUnspecified;
};

// Bytes: token b (0..255) is the byte b; the separator is 256; V = 257.
inline constexpr int32_t kByteSeparator = 256;
inline constexpr int64_t kByteVocab = 257;
// Codons (GenSLMs' tokenisation of genes): token 16 a + 4 b + c for the codon of bases a, b, c
// with A = 0, C = 1, G = 2, T = 3 (U reads as T); 64 is the document separator, 65 a codon with
// any other letter (N, IUPAC codes); V = 66.
inline constexpr int32_t kCodonSeparator = 64;
inline constexpr int32_t kCodonUnknown = 65;
inline constexpr int64_t kCodonVocab = 66;

// The bytes of `text` as tokens.
std::vector<int32_t> tokenize_bytes(std::string_view text);

// What the FASTA reader saw.
struct FastaStats {
  int64_t records = 0;
  int64_t empty_records = 0;  // records with no bases (skipped)
  int64_t codons = 0;
  int64_t unknown_codons = 0;  // codons with a letter other than A, C, G, T, U
  int64_t dropped_bases = 0;   // the 1 or 2 bases after a record's last whole codon
};
// Each record of a FASTA text (">" header lines, then sequence lines; whitespace ignored, any
// case) as one document of codon tokens, read in frame from its first base. Fails, naming the
// line, on sequence text before the first header or a character that is not a letter or "*"/"-".
Status tokenize_fasta(std::string_view text, std::vector<std::vector<int32_t>>* documents,
                      FastaStats* stats);

// Writes documents (each followed by `separator`) as a token file. The width is 2 bytes when
// vocab_size <= 65536, else 4. Fails, naming the document and position, on a token outside
// [0, vocab_size).
Status write_token_file(const std::string& path, const std::vector<std::vector<int32_t>>& documents,
                        uint64_t vocab_size, uint32_t separator, Tokenizer tokenizer);

// A token file, memory-mapped read-only.
class TokenFile {
 public:
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  // Checks the header (magic, version, width, sizes against the file's length) with messages
  // that name the file and the field.
  static Status open(const std::string& path, std::unique_ptr<TokenFile>* out);

  const TokenFileHeader& header() const { return header_; }
  const std::string& path() const { return path_; }
  // Copies tokens [start, start + count) into out.
  void read(uint64_t start, uint64_t count, int32_t* out) const;

 private:
  TokenFile() = default;
  TokenFileHeader header_;
  std::string path_;
  const unsigned char* map_ = nullptr;
  size_t map_bytes_ = 0;
};

// Where the loader is: everything needed to continue the same sequence of batches.
struct DataPosition {
  uint64_t seed = 0;
  uint64_t epoch = 0;
  uint64_t cursor = 0;  // samples of this epoch already handed out
};

// Packs the token stream into samples of L + 1 consecutive tokens, sample k starting at token
// k * L (inputs are its first L tokens, targets its last L: each token predicts the next, across
// document separators), and hands them out in an order shuffled per epoch: epoch e uses a
// Fisher-Yates permutation from Rng(seed + e * 0x9E3779B97F4A7C15) (the identity with
// shuffle off). A micro-batch takes the next B samples, wrapping into the next epoch.
class DataLoader {
 public:
  // Fails when the file has fewer than B samples of L + 1 tokens (the message gives the
  // numbers), or the file's vocabulary exceeds the model's (naming both).
  static Status create(const TokenFile* file, int64_t sequence_length, int64_t batch,
                       int64_t model_vocab, bool shuffle, uint64_t seed,
                       std::unique_ptr<DataLoader>* out);

  uint64_t num_samples() const { return samples_; }
  const DataPosition& position() const { return position_; }
  // Continues from a saved position (same file, length, batch and shuffle).
  Status set_position(const DataPosition& position);

  // The next micro-batch: inputs and targets [B, L] each.
  void next(int32_t* inputs, int32_t* targets);
  // Moves past `micro_batches` micro-batches without reading them (the position ends where that
  // many next() calls would leave it): a data-parallel rank skips the other ranks' micro-batches
  // of the global batch, so every rank walks the same sequence.
  void skip(int64_t micro_batches);

 private:
  DataLoader() = default;
  void start_epoch();

  const TokenFile* file_ = nullptr;
  int64_t length_ = 0;
  int64_t batch_ = 0;
  bool shuffle_ = true;
  uint64_t samples_ = 0;
  DataPosition position_;
  std::vector<uint64_t> order_;  // this epoch's permutation
  std::vector<int32_t> window_;
};

}  // namespace sciattn::train
