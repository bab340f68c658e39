// `sciattn data`: makes a token file for `sciattn train` from text (bytes) or FASTA (codons),
// optionally shuffling the documents with a seed. Tools layer: the trainer's public API only.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "sciattn/train/data.h"
#include "sciattn/train/random.h"

namespace sciattn::tools {
namespace {

constexpr int kExitBadInput = 2;

struct DataArgs {
  std::vector<std::string> text, fasta;
  std::string out;
  bool lines = false;
  bool shuffle = false;
  uint64_t seed = 0;
};

[[noreturn]] void fail(const std::string& message) {
  std::cerr << "sciattn data: " << message << "\n";
  throw CLI::RuntimeError(kExitBadInput);
}

std::string read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read \"" + path + "\"");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void run_data(const DataArgs& a) {
  if (a.text.empty() == a.fasta.empty()) {
    fail("give input files with exactly one of --text (bytes) or --fasta (codons)");
  }
  std::vector<std::vector<int32_t>> documents;
  train::Tokenizer tokenizer;
  uint64_t vocab;
  uint32_t separator;
  std::string details;
  if (!a.text.empty()) {
    tokenizer = train::Tokenizer::kBytes;
    vocab = train::kByteVocab;
    separator = train::kByteSeparator;
    for (const std::string& path : a.text) {
      const std::string text = read_whole(path);
      if (!a.lines) {
        if (!text.empty()) documents.push_back(train::tokenize_bytes(text));
        continue;
      }
      size_t pos = 0;
      while (pos < text.size()) {
        size_t end = text.find('\n', pos);
        if (end == std::string::npos) end = text.size();
        if (end > pos) documents.push_back(train::tokenize_bytes(text.substr(pos, end - pos)));
        pos = end + 1;
      }
    }
  } else {
    tokenizer = train::Tokenizer::kCodons;
    vocab = train::kCodonVocab;
    separator = train::kCodonSeparator;
    train::FastaStats total;
    for (const std::string& path : a.fasta) {
      std::vector<std::vector<int32_t>> docs;
      train::FastaStats st;
      Status s = train::tokenize_fasta(read_whole(path), &docs, &st);
      if (!s.ok()) fail("\"" + path + "\": " + s.message());
      documents.insert(documents.end(), docs.begin(), docs.end());
      total.records += st.records;
      total.empty_records += st.empty_records;
      total.codons += st.codons;
      total.unknown_codons += st.unknown_codons;
      total.dropped_bases += st.dropped_bases;
    }
    details = "; " + std::to_string(total.records) + " FASTA records (" +
              std::to_string(total.empty_records) + " empty, skipped), " +
              std::to_string(total.codons) + " codons (" + std::to_string(total.unknown_codons) +
              " with letters other than ACGTU), " + std::to_string(total.dropped_bases) +
              " trailing bases dropped";
  }
  if (documents.empty()) fail("the input holds no document");
  if (a.shuffle) {
    // Fisher-Yates over the documents with the trainer's generator.
    train::Rng rng(a.seed);
    for (size_t i = documents.size() - 1; i > 0; --i) {
      std::swap(documents[i], documents[rng.below(i + 1)]);
    }
  }
  Status s = train::write_token_file(a.out, documents, vocab, separator, tokenizer);
  if (!s.ok()) fail(s.message());
  uint64_t tokens = 0;
  for (const auto& d : documents) tokens += d.size() + 1;
  std::cout << "wrote " << a.out << ": " << documents.size() << " documents, " << tokens
            << " tokens (" << train::tokenizer_name(tokenizer) << ", vocabulary " << vocab
            << ", separator " << separator << ", " << (vocab <= 65536 ? 2 : 4) << "-byte tokens"
            << (a.shuffle ? ", documents shuffled with seed " + std::to_string(a.seed) : "") << ")"
            << details << "\n";
}

}  // namespace

void add_data_command(CLI::App& app) {
  auto args = std::make_shared<DataArgs>();
  CLI::App* cmd = app.add_subcommand(
      "data",
      "Make a token file for `sciattn train` (format: docs/training.md). Text is tokenised as\n"
      "bytes (vocabulary 257: bytes 0-255, document separator 256); FASTA as codons (vocabulary\n"
      "66: 64 codons, separator 64, unknown codon 65), one document per record. Each document is\n"
      "followed by the separator.");
  cmd->add_option("--text", args->text, "text files, one document each (see --lines)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--fasta", args->fasta, "FASTA files, one document per record")
      ->check(CLI::ExistingFile);
  cmd->add_option("--out,-o", args->out, "the token file to write")->required();
  cmd->add_flag("--lines", args->lines, "text: each non-empty line is a document");
  cmd->add_flag("--shuffle", args->shuffle, "shuffle the documents (with --seed)");
  cmd->add_option("--seed", args->seed, "seed of the document shuffle (default 0)");
  cmd->callback([args] { run_data(*args); });
}

}  // namespace sciattn::tools
