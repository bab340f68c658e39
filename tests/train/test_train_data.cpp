// Token files (round trip, both widths, every header error), the byte and FASTA codon
// tokenizers, and the loader's packing and seeded shuffling. Test layer (cpu).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "process_temp_dir.h"
#include "sciattn/train/data.h"

namespace sciattn::train {
namespace {

std::string temp_path(const std::string& name) {
  return sciattn::testing::process_temp_dir() + name;
}

std::vector<int32_t> read_all(const TokenFile& f) {
  std::vector<int32_t> t(static_cast<size_t>(f.header().num_tokens));
  f.read(0, t.size(), t.data());
  return t;
}

TEST(TrainData, TokenFileRoundTripsBothWidths) {
  for (uint64_t vocab : {uint64_t{kByteVocab}, uint64_t{70000}}) {
    const std::vector<std::vector<int32_t>> docs = {
        {1, 2, 3}, {}, {static_cast<int32_t>(vocab - 2)}};
    const uint32_t sep = static_cast<uint32_t>(vocab - 1);
    const std::string path = temp_path("roundtrip.tok");
    ASSERT_TRUE(write_token_file(path, docs, vocab, sep, Tokenizer::kBytes).ok());
    std::unique_ptr<TokenFile> f;
    ASSERT_TRUE(TokenFile::open(path, &f).ok());
    EXPECT_EQ(f->header().token_bytes, vocab <= 65536 ? 2u : 4u);
    EXPECT_EQ(f->header().vocab_size, vocab);
    EXPECT_EQ(f->header().num_documents, 3u);
    EXPECT_EQ(f->header().separator, sep);
    EXPECT_EQ(f->header().tokenizer, Tokenizer::kBytes);
    const int32_t s = static_cast<int32_t>(sep);
    EXPECT_EQ(read_all(*f),
              (std::vector<int32_t>{1, 2, 3, s, s, static_cast<int32_t>(vocab - 2), s}));
    // The layout is the documented one: 64-byte header, then little-endian tokens.
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(bytes.substr(0, 8), "SCIATOKN");
    EXPECT_EQ(bytes.size(), 64u + 7u * f->header().token_bytes);
    EXPECT_EQ(static_cast<unsigned char>(bytes[64]), 1);  // token 1, low byte first
  }
}

TEST(TrainData, WriteRejectsTokensOutsideTheVocabulary) {
  Status s = write_token_file(temp_path("bad.tok"), {{1, 2}, {3, 300}}, kByteVocab, kByteSeparator,
                              Tokenizer::kBytes);
  EXPECT_NE(s.message().find("document 1, position 1: token 300"), std::string::npos)
      << s.message();
}

TEST(TrainData, BadTokenFilesAreRejectedByName) {
  const std::string good = temp_path("good.tok");
  ASSERT_TRUE(
      write_token_file(good, {{1, 2, 3}}, kByteVocab, kByteSeparator, Tokenizer::kBytes).ok());
  std::ifstream in(good, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto expect = [](const std::string& content, const std::string& fragment) {
    const std::string path = temp_path("broken.tok");
    std::ofstream(path, std::ios::binary) << content;
    std::unique_ptr<TokenFile> f;
    Status s = TokenFile::open(path, &f);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find(fragment), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("broken.tok"), std::string::npos) << s.message();
  };
  expect("short", "shorter than the 64-byte header");
  std::string b = bytes;
  b[0] = 'X';
  expect(b, "magic");
  b = bytes;
  b[8] = 9;
  expect(b, "version 9");
  b = bytes;
  b[12] = 3;
  expect(b, "token width 3");
  expect(bytes.substr(0, bytes.size() - 1), "bytes follow the header");
  std::unique_ptr<TokenFile> f;
  Status s = TokenFile::open(temp_path("missing.tok"), &f);
  EXPECT_NE(s.message().find("cannot read token file"), std::string::npos) << s.message();
}

TEST(TrainData, FastaCodons) {
  const std::string fasta =
      ">gene1 first\nATGaaa\nccc\n"  // ATG = 0*16+3*4+2 = 14, AAA = 0, CCC = 21, split lines
      ";comment\n"
      ">gene2\nAUG NNN TT\r\n"  // U reads as T; NNN unknown; TT dropped
      ">empty\n"
      ">gene3\nTTT\n";
  std::vector<std::vector<int32_t>> docs;
  FastaStats st;
  ASSERT_TRUE(tokenize_fasta(fasta, &docs, &st).ok());
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0], (std::vector<int32_t>{14, 0, 21}));
  EXPECT_EQ(docs[1], (std::vector<int32_t>{14, kCodonUnknown}));
  EXPECT_EQ(docs[2], (std::vector<int32_t>{63}));
  EXPECT_EQ(st.records, 4);
  EXPECT_EQ(st.empty_records, 1);
  EXPECT_EQ(st.codons, 6);
  EXPECT_EQ(st.unknown_codons, 1);
  EXPECT_EQ(st.dropped_bases, 2);
  Status s = tokenize_fasta("ACGT\n>x\nACG\n", &docs, &st);
  EXPECT_NE(s.message().find("line 1: sequence text before the first \">\""), std::string::npos);
  s = tokenize_fasta(">x\nAC1G\n", &docs, &st);
  EXPECT_NE(s.message().find("line 2: character '1'"), std::string::npos) << s.message();
}

TEST(TrainData, BytesAreTokens) {
  EXPECT_EQ(tokenize_bytes("a\xff"), (std::vector<int32_t>{97, 255}));
}

std::unique_ptr<TokenFile> counting_file(int32_t n) {
  // Tokens 0, 1, ..., n - 1 (mod 250) in one document: windows are easy to recognise.
  std::vector<int32_t> doc(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) doc[static_cast<size_t>(i)] = i % 250;
  const std::string path = temp_path("count.tok");
  EXPECT_TRUE(write_token_file(path, {doc}, kByteVocab, kNoSeparator, Tokenizer::kBytes).ok());
  std::unique_ptr<TokenFile> f;
  EXPECT_TRUE(TokenFile::open(path, &f).ok());
  return f;
}

TEST(TrainData, PackingWithoutShuffleIsSequential) {
  auto f = counting_file(41);  // (41 - 1) / 8 = 5 samples of 9 tokens
  std::unique_ptr<DataLoader> d;
  ASSERT_TRUE(DataLoader::create(f.get(), 8, 2, 300, false, 0, &d).ok());
  EXPECT_EQ(d->num_samples(), 5u);
  std::vector<int32_t> in(16), tg(16);
  d->next(in.data(), tg.data());
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(in[i], i);      // samples 0 and 1: tokens 0..7, 8..15
    EXPECT_EQ(tg[i], i + 1);  // each token predicts the next
  }
  d->next(in.data(), tg.data());  // samples 2, 3
  d->next(in.data(), tg.data());  // sample 4, then epoch 1's sample 0
  EXPECT_EQ(in[0], 32);
  EXPECT_EQ(in[8], 0);
  EXPECT_EQ(d->position().epoch, 1u);
  EXPECT_EQ(d->position().cursor, 1u);
}

TEST(TrainData, ShuffleIsASeededPermutationPerEpochAndResumes) {
  auto f = counting_file(8 * 50 + 1);  // 50 samples
  auto first_tokens = [&](uint64_t seed, int batches, DataLoader** keep,
                          std::unique_ptr<DataLoader>* holder) {
    EXPECT_TRUE(DataLoader::create(f.get(), 8, 5, 300, true, seed, holder).ok());
    std::vector<int32_t> starts, in(40), tg(40);
    for (int b = 0; b < batches; ++b) {
      (*holder)->next(in.data(), tg.data());
      for (int s = 0; s < 5; ++s) starts.push_back(in[s * 8]);
    }
    if (keep) *keep = holder->get();
    return starts;
  };
  std::unique_ptr<DataLoader> a, b, c;
  const auto epoch_a = first_tokens(7, 10, nullptr, &a);
  const auto epoch_b = first_tokens(7, 10, nullptr, &b);
  const auto epoch_c = first_tokens(8, 10, nullptr, &c);
  EXPECT_EQ(epoch_a, epoch_b);
  EXPECT_NE(epoch_a, epoch_c);
  std::set<int32_t> seen(epoch_a.begin(), epoch_a.end());
  EXPECT_EQ(seen.size(), 50u);  // every sample once per epoch
  // The next epoch is another order; a loader set to a saved position continues identically.
  std::vector<int32_t> in(40), tg(40), in2(40), tg2(40);
  a->next(in.data(), tg.data());
  const DataPosition saved = a->position();
  std::unique_ptr<DataLoader> r;
  ASSERT_TRUE(DataLoader::create(f.get(), 8, 5, 300, true, 99, &r).ok());
  ASSERT_TRUE(r->set_position(saved).ok());
  for (int k = 0; k < 12; ++k) {
    a->next(in.data(), tg.data());
    r->next(in2.data(), tg2.data());
    ASSERT_EQ(in, in2) << "batch " << k;
  }
}

TEST(TrainData, LoaderErrorsGiveTheNumbers) {
  auto f = counting_file(20);
  std::unique_ptr<DataLoader> d;
  Status s = DataLoader::create(f.get(), 8, 3, 300, true, 0, &d);
  EXPECT_NE(s.message().find("holds 20 tokens: 2 samples of sequence_length + 1 = 9 tokens, "
                             "fewer than one micro-batch of 3"),
            std::string::npos)
      << s.message();
  s = DataLoader::create(f.get(), 8, 1, 100, true, 0, &d);
  EXPECT_NE(s.message().find("vocabulary size 257, larger than the model's vocab_size 100"),
            std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace sciattn::train
