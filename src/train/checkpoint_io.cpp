// Checkpoints (trainer.h): the file format's writer and reader, and the trainer's save and load,
// on one rank (one file) and on several (a folder of shards). Trainer layer (host code).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <utility>

#include "common/status_try.h"
#include "sciattn/train/lr_schedule.h"
#include "sciattn/train/trainer.h"
#include "train/checkpoint_io.h"
#include "train/json_util.h"

namespace sciattn::train {
namespace detail {

constexpr size_t kDataAlign = 64;

// Writes a file through "<path>.tmp", renamed into place once `write` has filled it, so that a
// failure never leaves a partial file under `path` (nor the temporary one).
template <class WriteFn>
Status write_then_rename(const std::string& path, WriteFn&& write) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out)
      return Status::invalid_argument("cannot write \"" + tmp + "\": " + std::strerror(errno));
    write(out);
    out.flush();
    if (!out) {
      const std::string reason = std::strerror(errno);
      out.close();
      std::remove(tmp.c_str());
      return Status::invalid_argument("cannot write \"" + tmp + "\": " + reason);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(tmp.c_str());
    return Status::invalid_argument("cannot rename \"" + tmp + "\" to \"" + path + "\": " + reason);
  }
  return Status::ok_status();
}

Status write_checkpoint_file(const std::string& path, Json header,
                             const std::vector<OutTensor>& tensors) {
  Json list = Json::array();
  uint64_t offset = 0;
  for (const OutTensor& t : tensors) {
    list.push_back({{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}, {"offset", offset}});
    offset += t.bytes;
  }
  header["tensors"] = list;
  std::string text = header.dump();
  const size_t fixed = 16;  // magic + length
  const size_t padded = (fixed + text.size() + kDataAlign - 1) / kDataAlign * kDataAlign - fixed;
  text.append(padded - text.size(), ' ');
  return write_then_rename(path, [&](std::ofstream& out) {
    out.write(kCheckpointMagic, 8);
    unsigned char len[8];
    for (int i = 0; i < 8; ++i)
      len[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const OutTensor& t : tensors) {
      out.write(static_cast<const char*>(t.data), static_cast<std::streamsize>(t.bytes));
    }
  });
}

void add_slot_tensors(const ParameterLayout& layout, const std::string& prefix, const float* base,
                      std::vector<OutTensor>* out) {
  for (const TensorSlot& s : layout.slots) {
    out->push_back({prefix + "/" + s.name, "f32", s.shape, base + s.offset,
                    static_cast<size_t>(s.numel) * sizeof(float)});
  }
}

}  // namespace detail

namespace {

using detail::add_slot_tensors;
using detail::Json;
using detail::OutTensor;
using detail::write_checkpoint_file;

Json scaler_json(const LossScalerState& s) {
  return {{"cur_scale", s.cur_scale},
          {"cur_iter", s.cur_iter},
          {"last_overflow_iter", s.last_overflow_iter},
          {"cur_hysteresis", s.cur_hysteresis}};
}

constexpr int64_t kFileCheckpointVersion = 1;
constexpr int64_t kFolderCheckpointVersion = 2;
constexpr char kManifestName[] = "manifest.json";
constexpr char kReplicatedName[] = "replicated.ckpt";

// "shard-00001-of-00004.ckpt"
std::string shard_file_name(int rank, int world) {
  char name[64];
  std::snprintf(name, sizeof name, "shard-%05d-of-%05d.ckpt", rank, world);
  return name;
}

// Rank r's part [begin, end) of a flat space of `total` elements split over `world` ranks: equal
// parts of a multiple of kSlotAlign elements (the last ones shorter or empty when total is not a
// multiple of world x kSlotAlign). With ZeRO the total is such a multiple, and these are its
// shards.
std::pair<int64_t, int64_t> shard_bounds(int64_t total, int world, int r) {
  const int64_t unit = zero_parameter_multiple(world);
  const int64_t part = (total + unit - 1) / unit * kSlotAlign;
  return {std::min(total, part * r), std::min(total, part * (r + 1))};
}

// Text through a temporary file renamed into place.
Status write_text_file(const std::string& path, const std::string& text) {
  return detail::write_then_rename(path, [&](std::ofstream& out) {
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
  });
}

// Every rank learns whether any rank failed: this rank's own error, or one naming the (highest)
// rank that failed, so that no rank goes on alone.
Status agree(Communicator& comm, const Status& mine, const std::string& when) {
  double failed = mine.ok() ? 0.0 : comm.rank() + 1.0;
  SCIATTN_TRY(comm.all_reduce_max(&failed));
  if (!mine.ok()) return mine;
  if (failed != 0.0) {
    return Status::invalid_argument("rank " + std::to_string(static_cast<int>(failed) - 1) +
                                    " failed " + when);
  }
  return Status::ok_status();
}

// Per-slot tensors "<kind>/<slot>" into flat buffers of the layout's total (zeros between and
// after the slots); each kind must hold every slot once and nothing else may appear.
Status slots_to_flat(const std::vector<CheckpointTensor>& tensors, const ParameterLayout& layout,
                     const std::string& what,
                     const std::vector<std::pair<std::string, std::vector<float>*>>& kinds) {
  for (const auto& k : kinds) k.second->assign(static_cast<size_t>(layout.total), 0.0f);
  size_t found = 0;
  for (const CheckpointTensor& t : tensors) {
    const size_t slash = t.name.find('/');
    const std::string kind = t.name.substr(0, slash);
    const std::string slot = slash == std::string::npos ? "" : t.name.substr(slash + 1);
    const TensorSlot* s = layout.find(slot);
    std::vector<float>* dst = nullptr;
    for (const auto& k : kinds) {
      if (k.first == kind) dst = k.second;
    }
    if (s == nullptr || dst == nullptr || t.shape != s->shape || t.dtype != "f32") {
      return Status::invalid_argument(what + ": unexpected tensor \"" + t.name + "\"");
    }
    std::memcpy(dst->data() + s->offset, t.bytes.data(), t.bytes.size());
    ++found;
  }
  if (found != kinds.size() * layout.slots.size()) {
    return Status::invalid_argument(what + " holds " + std::to_string(found) +
                                    " tensors; a checkpoint of this model has " +
                                    std::to_string(kinds.size() * layout.slots.size()));
  }
  return Status::ok_status();
}

}  // namespace

// What a rank reads from a checkpoint: the weights over this run's layout, and the optimizer
// state over the rank's range of the flat space.
struct FlatState {
  std::vector<float> params;
  std::vector<float> master, exp_avg, exp_avg_sq;
};

// The checkpoint code that needs the trainer's private state (a friend of Trainer).
struct CheckpointIo {
  // The header's replicated state: everything but "format", "version" and the tensor list.
  static Json state_header(const Trainer& t) {
    const LossScalerState& ls = t.scaler_.state();
    const DataPosition& dp = t.loader_->position();
    const TrainConfig& c = t.config_;
    return {
        {"model", Json::parse(gpt_config_json(t.model_config_))},
        {"trainer",
         {{"global_step", t.global_step_},
          {"applied_steps", t.applied_steps_},
          {"skipped_steps", t.skipped_steps_}}},
        {"optimizer",
         {{"type", c.optimizer_type},
          {"lr", c.optimizer.lr},
          {"betas", {c.optimizer.beta1, c.optimizer.beta2}},
          {"eps", c.optimizer.eps},
          {"weight_decay", c.optimizer.weight_decay},
          {"step", t.applied_steps_}}},
        {"scheduler",
         {{"type", lr_schedule_name(c.schedule.type)},
          {"last_batch_iteration", t.applied_steps_ - 1}}},
        {"loss_scaler", scaler_json(ls)},
        {"clipper",
         {{"mode", clip_mode_name(c.clip.mode)},
          {"threshold", t.clipper_.threshold()},
          {"history",
           std::vector<double>(t.clipper_.history().begin(), t.clipper_.history().end())}}},
        {"data",
         {{"seed", dp.seed},
          {"epoch", dp.epoch},
          {"cursor", dp.cursor},
          {"shuffle", t.options_.shuffle},
          {"micro_batch", c.micro_batch_size},
          {"samples", t.loader_->num_samples()}}},
        // All randomness of a run derives from the model's seed (initialisation) and the data
        // seed and epoch (the shuffle), so the data position restores it exactly.
        {"rng", "derived: model.seed, data.seed and data.epoch"},
    };
  }

  // Whether a header's state fits this run: the model, the data settings, the clipping mode.
  static Status check_state(const Trainer& t, const Json& h, const std::string& what) {
    GptConfig saved;
    SCIATTN_TRY(parse_gpt_config(h.at("model").dump(), what, &saved));
    if (gpt_config_json(saved) != gpt_config_json(t.model_config_)) {
      return Status::invalid_argument(
          what + " was written for another model: " + h.at("model").dump() +
          "; this run's model file is " + gpt_config_json(t.model_config_));
    }
    const Json& d = h.at("data");
    const TrainConfig& c = t.config_;
    if (d.at("micro_batch").get<int64_t>() != c.micro_batch_size ||
        d.at("samples").get<uint64_t>() != t.loader_->num_samples() ||
        d.at("shuffle").get<bool>() != t.options_.shuffle) {
      return Status::invalid_argument(
          what +
          " was written with another micro-batch, data file or shuffle setting (micro "
          "batch " +
          d.at("micro_batch").dump() + ", " + d.at("samples").dump() + " samples, shuffle " +
          d.at("shuffle").dump() + "); this run has " + std::to_string(c.micro_batch_size) + ", " +
          std::to_string(t.loader_->num_samples()) + ", " +
          (t.options_.shuffle ? "true" : "false"));
    }
    const Json& jc = h.at("clipper");
    if (jc.at("mode").get<std::string>() != clip_mode_name(c.clip.mode)) {
      return Status::invalid_argument(what + " was written with gradient clipping \"" +
                                      jc.at("mode").get<std::string>() + "\"; this run has \"" +
                                      clip_mode_name(c.clip.mode) + "\"");
    }
    return Status::ok_status();
  }

  // Restores the header's replicated state (check_state passed).
  static Status apply_state(Trainer& t, const Json& h) {
    const Json& js = h.at("loss_scaler");
    LossScalerState ls;
    ls.cur_scale = js.at("cur_scale").get<double>();
    ls.cur_iter = js.at("cur_iter").get<int64_t>();
    ls.last_overflow_iter = js.at("last_overflow_iter").get<int64_t>();
    ls.cur_hysteresis = js.at("cur_hysteresis").get<int>();
    const Json& jc = h.at("clipper");
    // Without clipping the threshold is +infinity, which JSON writes as null.
    const double threshold = jc.at("threshold").is_null() ? std::numeric_limits<double>::infinity()
                                                          : jc.at("threshold").get<double>();
    SCIATTN_TRY(t.clipper_.set_state(threshold, jc.at("history").get<std::vector<double>>()));
    const Json& d = h.at("data");
    DataPosition pos;
    pos.seed = d.at("seed").get<uint64_t>();
    pos.epoch = d.at("epoch").get<uint64_t>();
    pos.cursor = d.at("cursor").get<uint64_t>();
    SCIATTN_TRY(t.loader_->set_position(pos));
    if (t.config_.precision == Precision::kFp16) t.scaler_.set_state(ls);
    const Json& tr = h.at("trainer");
    t.global_step_ = tr.at("global_step").get<int64_t>();
    t.applied_steps_ = tr.at("applied_steps").get<int64_t>();
    t.skipped_steps_ = tr.at("skipped_steps").get<int64_t>();
    return Status::ok_status();
  }

  // Every rank writes its shard file, rank 0 also the replicated file, and rank 0 writes the
  // manifest last (the folder layout is in trainer.h).
  static Status save_sharded(Trainer& t, const std::string& dir);
  // Reads what this rank needs of a checkpoint (a file or a folder): the header with the
  // replicated state, the weights (this run's layout) and the optimizer state over this rank's
  // range of the flat space.
  static Status read(const Trainer& t, const std::string& path, Json* header, FlatState* out);
  static Status read_file_format(const Trainer& t, const std::string& path, Json* header,
                                 FlatState* out);
  static Status read_folder_format(const Trainer& t, const std::string& dir, Json* header,
                                   FlatState* out);

  // The range of the flat space whose optimizer state this rank keeps.
  static void state_range(const Trainer& t, int64_t* lo, int64_t* hi) {
    if (t.zero_ != nullptr) {
      *lo = t.zero_->shard_begin();
      *hi = *lo + t.zero_->shard_size();
    } else {
      *lo = 0;
      *hi = t.model_->layout().total;
    }
  }
};

Status Trainer::save_checkpoint(const std::string& path) {
  if (comm_->world_size() > 1) return CheckpointIo::save_sharded(*this, path);
  SCIATTN_TRY(finish_update());
  std::vector<float> params, m, v;
  SCIATTN_TRY(state_to_host(master_, &params));
  SCIATTN_TRY(state_to_host(exp_avg_, &m));
  SCIATTN_TRY(state_to_host(exp_avg_sq_, &v));
  Json header = {{"format", "sciattn-checkpoint"}, {"version", kFileCheckpointVersion}};
  header.update(CheckpointIo::state_header(*this));
  std::vector<OutTensor> tensors;
  const ParameterLayout& layout = model_->layout();
  add_slot_tensors(layout, "params", params.data(), &tensors);
  add_slot_tensors(layout, "exp_avg", m.data(), &tensors);
  add_slot_tensors(layout, "exp_avg_sq", v.data(), &tensors);
  return write_checkpoint_file(path, header, tensors);
}

Status CheckpointIo::save_sharded(Trainer& t, const std::string& dir) {
  SCIATTN_TRY(t.finish_update());
  Communicator& comm = *t.comm_;
  const int world = comm.world_size(), rank = comm.rank();
  const int64_t total = t.model_->layout().total;
  const std::string what = "checkpoint folder \"" + dir + "\"";
  // The gathered fp32 master weights (a collective with ZeRO) and this rank's shard.
  std::vector<float> params, master, m, v;
  SCIATTN_TRY(t.master_parameters(&params));
  const int stage = t.zero_ != nullptr ? t.zero_->stage() : 0;
  std::vector<std::pair<int64_t, int64_t>> bounds(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) bounds[static_cast<size_t>(r)] = shard_bounds(total, world, r);
  const auto [begin, end] = bounds[static_cast<size_t>(rank)];
  if (t.zero_ != nullptr) {
    // ZeRO's shards are these bounds (the layout is padded to N equal shards).
    SCIATTN_TRY(t.zero_->shard_to_host(ZeroOptimizer::State::kMaster, &master));
    SCIATTN_TRY(t.zero_->shard_to_host(ZeroOptimizer::State::kExpAvg, &m));
    SCIATTN_TRY(t.zero_->shard_to_host(ZeroOptimizer::State::kExpAvgSq, &v));
  } else {
    // Stage 0: every rank holds all of it and writes its 1/N.
    SCIATTN_TRY(t.state_to_host(t.master_, &master));
    SCIATTN_TRY(t.state_to_host(t.exp_avg_, &m));
    SCIATTN_TRY(t.state_to_host(t.exp_avg_sq_, &v));
    for (std::vector<float>* x : {&master, &m, &v}) {
      *x = std::vector<float>(x->begin() + begin, x->begin() + end);
    }
  }
  if (static_cast<int64_t>(master.size()) != end - begin) {
    return Status(StatusCode::kInternal, "the ZeRO shard does not match the checkpoint's bounds");
  }

  // 1. Rank 0 makes the folder and removes an older manifest, so that a save that stops half way
  //    leaves a folder that is refused rather than one that mixes two saves.
  Status s = Status::ok_status();
  if (rank == 0) {
    std::error_code ec;
    if (std::filesystem::exists(dir, ec) && !std::filesystem::is_directory(dir, ec)) {
      s = Status::invalid_argument(what +
                                   ": the path exists and is not a folder (with several "
                                   "data-parallel ranks a checkpoint is a folder)");
    } else {
      std::filesystem::create_directories(dir, ec);
      if (ec) s = Status::invalid_argument("cannot create " + what + ": " + ec.message());
      std::filesystem::remove(dir + "/" + kManifestName, ec);
      if (s.ok() && ec) {
        s = Status::invalid_argument("cannot remove the old manifest of " + what + ": " +
                                     ec.message());
      }
    }
  }
  SCIATTN_TRY(agree(comm, s, "while preparing " + what));

  // 2. The shards, and the replicated state from rank 0.
  const int64_t step = t.global_step_;
  Json sh = {{"format", "sciattn-checkpoint-shard"},
             {"version", kFolderCheckpointVersion},
             {"rank", rank},
             {"world_size", world},
             {"begin", begin},
             {"end", end},
             {"global_step", step}};
  const int64_t n = end - begin;
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  s = write_checkpoint_file(dir + "/" + shard_file_name(rank, world), sh,
                            {{"master", "f32", {n}, master.data(), bytes},
                             {"exp_avg", "f32", {n}, m.data(), bytes},
                             {"exp_avg_sq", "f32", {n}, v.data(), bytes}});
  if (s.ok() && rank == 0) {
    Json header = {{"format", "sciattn-checkpoint-replicated"},
                   {"version", kFolderCheckpointVersion}};
    header.update(state_header(t));
    std::vector<OutTensor> tensors;
    add_slot_tensors(t.model_->layout(), "params", params.data(), &tensors);
    s = write_checkpoint_file(dir + "/" + kReplicatedName, header, tensors);
  }
  SCIATTN_TRY(agree(comm, s, "while writing " + what));

  // 3. The manifest, last.
  if (rank == 0) {
    Json shards = Json::array();
    for (int r = 0; r < world; ++r) {
      shards.push_back({{"file", shard_file_name(r, world)},
                        {"rank", r},
                        {"begin", bounds[static_cast<size_t>(r)].first},
                        {"end", bounds[static_cast<size_t>(r)].second}});
    }
    const Json manifest = {{"format", "sciattn-sharded-checkpoint"},
                           {"version", kFolderCheckpointVersion},
                           {"world_size", world},
                           {"zero_stage", stage},
                           {"flat_size", total},
                           {"parameters", gpt_parameter_layout(t.model_config_).total},
                           {"global_step", step},
                           {"replicated", kReplicatedName},
                           {"shards", shards}};
    s = write_text_file(dir + "/" + kManifestName, manifest.dump(2) + "\n");
  }
  return agree(comm, s, "while writing the manifest of " + what);
}

Status read_checkpoint(const std::string& path, std::string* header_json,
                       std::vector<CheckpointTensor>* tensors) {
  std::string bytes;
  SCIATTN_TRY(detail::read_file(path, &bytes));
  const std::string what = "checkpoint \"" + path + "\"";
  if (bytes.size() < 16 || std::memcmp(bytes.data(), kCheckpointMagic, 8) != 0) {
    return Status::invalid_argument(what + " does not start with the magic \"SCIACKPT\"");
  }
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i) {
    length |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
  }
  if (length > bytes.size() - 16) {
    return Status::invalid_argument(what + " is truncated: its header says " +
                                    std::to_string(length) + " bytes");
  }
  *header_json = bytes.substr(16, length);
  Json header;
  SCIATTN_TRY(detail::parse_json(*header_json, what, &header));
  const size_t data = 16 + length;
  tensors->clear();
  try {
    for (const Json& t : header.at("tensors")) {
      CheckpointTensor ct;
      ct.name = t.at("name").get<std::string>();
      ct.dtype = t.at("dtype").get<std::string>();
      ct.shape = t.at("shape").get<std::vector<int64_t>>();
      int64_t numel = 1;
      for (int64_t d : ct.shape) numel *= d;
      const uint64_t offset = t.at("offset").get<uint64_t>();
      const uint64_t nbytes = static_cast<uint64_t>(numel) * 4;
      if (data + offset + nbytes > bytes.size()) {
        return Status::invalid_argument(what + " is truncated: tensor \"" + ct.name +
                                        "\" ends past the file");
      }
      ct.bytes.assign(bytes.begin() + static_cast<std::ptrdiff_t>(data + offset),
                      bytes.begin() + static_cast<std::ptrdiff_t>(data + offset + nbytes));
      tensors->push_back(std::move(ct));
    }
  } catch (const Json::exception& e) {
    return Status::invalid_argument(what + ": malformed tensor list: " + e.what());
  }
  return Status::ok_status();
}

Status CheckpointIo::read(const Trainer& t, const std::string& path, Json* header, FlatState* out) {
  std::error_code ec;
  try {
    if (std::filesystem::is_directory(path, ec)) {
      return read_folder_format(t, path, header, out);
    }
    return read_file_format(t, path, header, out);
  } catch (const Json::exception& e) {
    return Status::invalid_argument("checkpoint \"" + path + "\": malformed header: " + e.what());
  }
}

Status CheckpointIo::read_file_format(const Trainer& t, const std::string& path, Json* header,
                                      FlatState* out) {
  std::string text;
  std::vector<CheckpointTensor> tensors;
  SCIATTN_TRY(read_checkpoint(path, &text, &tensors));
  const std::string what = "checkpoint \"" + path + "\"";
  Json& h = *header;
  SCIATTN_TRY(detail::parse_json(text, what, &h));
  const std::string format = h.at("format").get<std::string>();
  if (format == "sciattn-checkpoint-replicated" || format == "sciattn-checkpoint-shard") {
    return Status::invalid_argument(what + " is one file of a checkpoint folder (\"" + format +
                                    "\"); load the folder that holds its " + kManifestName);
  }
  if (format != "sciattn-checkpoint") {
    return Status::invalid_argument(what + " is a \"" + format +
                                    "\" file, not a training checkpoint");
  }
  if (h.at("version").get<int64_t>() != kFileCheckpointVersion) {
    return Status::invalid_argument(what + " has version " + h.at("version").dump() +
                                    "; a checkpoint file of this build has version " +
                                    std::to_string(kFileCheckpointVersion));
  }
  SCIATTN_TRY(check_state(t, h, what));
  std::vector<float> master, m, v;
  SCIATTN_TRY(slots_to_flat(tensors, t.model_->layout(), what,
                            {{"params", &master}, {"exp_avg", &m}, {"exp_avg_sq", &v}}));
  int64_t lo = 0, hi = 0;
  state_range(t, &lo, &hi);
  out->params = master;
  out->master.assign(master.begin() + lo, master.begin() + hi);
  out->exp_avg.assign(m.begin() + lo, m.begin() + hi);
  out->exp_avg_sq.assign(v.begin() + lo, v.begin() + hi);
  return Status::ok_status();
}

Status CheckpointIo::read_folder_format(const Trainer& t, const std::string& dir, Json* header,
                                        FlatState* out) {
  const std::string manifest_path = dir + "/" + kManifestName;
  const std::string mwhat = "checkpoint manifest \"" + manifest_path + "\"";
  std::string text;
  Status s = detail::read_file(manifest_path, &text);
  if (!s.ok()) {
    return Status::invalid_argument("checkpoint folder \"" + dir + "\" has no readable " +
                                    kManifestName + " (an unfinished save?): " + s.message());
  }
  Json mf;
  SCIATTN_TRY(detail::parse_json(text, mwhat, &mf));
  if (mf.at("format").get<std::string>() != "sciattn-sharded-checkpoint") {
    return Status::invalid_argument(mwhat + " has format " + mf.at("format").dump() +
                                    "; expected \"sciattn-sharded-checkpoint\"");
  }
  if (mf.at("version").get<int64_t>() != kFolderCheckpointVersion) {
    return Status::invalid_argument(mwhat + " has version " + mf.at("version").dump() +
                                    "; this build reads checkpoint folders of version " +
                                    std::to_string(kFolderCheckpointVersion));
  }
  // Stages 0, 1 and 2 keep the same AdamW state over the same flat space, so each converts to any
  // other; a stage that partitions something else (the parameters, at stage 3) does not.
  const int64_t stage = mf.at("zero_stage").get<int64_t>();
  if (stage < 0 || stage > 2) {
    return Status::invalid_argument(mwhat + " was written at ZeRO stage " + std::to_string(stage) +
                                    ", which cannot be converted: this trainer loads the "
                                    "optimizer state of stages 0, 1 and 2");
  }
  const int64_t parameters = mf.at("parameters").get<int64_t>();
  const int64_t expected = gpt_parameter_layout(t.model_config_).total;
  if (parameters != expected) {
    return Status::invalid_argument(mwhat + " holds a flat space of " + std::to_string(parameters) +
                                    " elements (unpadded); this run's model has " +
                                    std::to_string(expected));
  }
  const int64_t world = mf.at("world_size").get<int64_t>();
  const int64_t flat = mf.at("flat_size").get<int64_t>();
  const Json& shards = mf.at("shards");
  if (world < 1 || static_cast<int64_t>(shards.size()) != world || flat < parameters) {
    return Status::invalid_argument(mwhat + " is inconsistent: world_size " +
                                    std::to_string(world) + ", " + std::to_string(shards.size()) +
                                    " shards, flat_size " + std::to_string(flat) + " for " +
                                    std::to_string(parameters) + " parameters");
  }
  const int64_t step = mf.at("global_step").get<int64_t>();
  // Every shard is checked here on every rank, so that every rank reports the same missing file.
  int64_t next = 0;
  for (int64_t r = 0; r < world; ++r) {
    const Json& e = shards[static_cast<size_t>(r)];
    const std::string file = e.at("file").get<std::string>();
    const int64_t b = e.at("begin").get<int64_t>(), en = e.at("end").get<int64_t>();
    if (e.at("rank").get<int64_t>() != r || b != next || en < b || en > flat ||
        file.find('/') != std::string::npos) {
      return Status::invalid_argument(mwhat + ": shard " + std::to_string(r) + " (" + e.dump() +
                                      ") does not continue the shards before it at element " +
                                      std::to_string(next));
    }
    next = en;
    std::error_code ec;
    if (!std::filesystem::is_regular_file(dir + "/" + file, ec)) {
      return Status::invalid_argument("checkpoint folder \"" + dir + "\" is missing shard file \"" +
                                      dir + "/" + file + "\" (rank " + std::to_string(r) + " of " +
                                      std::to_string(world) + ", elements [" + std::to_string(b) +
                                      ", " + std::to_string(en) + "))");
    }
  }
  if (next != flat) {
    return Status::invalid_argument(mwhat + ": the shards end at element " + std::to_string(next) +
                                    "; flat_size is " + std::to_string(flat));
  }

  // The replicated state and the weights.
  const std::string rpath = dir + "/" + mf.at("replicated").get<std::string>();
  const std::string rwhat = "checkpoint file \"" + rpath + "\"";
  std::vector<CheckpointTensor> tensors;
  SCIATTN_TRY(read_checkpoint(rpath, &text, &tensors));
  Json& h = *header;
  SCIATTN_TRY(detail::parse_json(text, rwhat, &h));
  if (h.at("format").get<std::string>() != "sciattn-checkpoint-replicated" ||
      h.at("version").get<int64_t>() != kFolderCheckpointVersion) {
    return Status::invalid_argument(rwhat + " is a \"" + h.at("format").get<std::string>() +
                                    "\" file of version " + h.at("version").dump() +
                                    "; expected \"sciattn-checkpoint-replicated\" version " +
                                    std::to_string(kFolderCheckpointVersion));
  }
  SCIATTN_TRY(check_state(t, h, rwhat));
  if (h.at("trainer").at("global_step").get<int64_t>() != step) {
    return Status::invalid_argument(rwhat + " is of global step " +
                                    h.at("trainer").at("global_step").dump() + "; " + mwhat +
                                    " says " + std::to_string(step));
  }
  SCIATTN_TRY(slots_to_flat(tensors, t.model_->layout(), rwhat, {{"params", &out->params}}));

  // This rank's range, re-sliced from the saved shards. Elements past the model's parameters
  // (this run's padding) stay zero.
  int64_t lo = 0, hi = 0;
  state_range(t, &lo, &hi);
  const size_t n = static_cast<size_t>(hi - lo);
  out->master.assign(n, 0.0f);
  out->exp_avg.assign(n, 0.0f);
  out->exp_avg_sq.assign(n, 0.0f);
  for (int64_t r = 0; r < world; ++r) {
    const Json& e = shards[static_cast<size_t>(r)];
    const int64_t b = e.at("begin").get<int64_t>(), en = e.at("end").get<int64_t>();
    const int64_t a = std::max(lo, b), z = std::min({hi, en, parameters});
    if (a >= z) continue;
    const std::string spath = dir + "/" + e.at("file").get<std::string>();
    const std::string swhat = "shard file \"" + spath + "\"";
    SCIATTN_TRY(read_checkpoint(spath, &text, &tensors));
    Json sh;
    SCIATTN_TRY(detail::parse_json(text, swhat, &sh));
    if (sh.at("format").get<std::string>() != "sciattn-checkpoint-shard" ||
        sh.at("version").get<int64_t>() != kFolderCheckpointVersion ||
        sh.at("rank").get<int64_t>() != r || sh.at("world_size").get<int64_t>() != world ||
        sh.at("begin").get<int64_t>() != b || sh.at("end").get<int64_t>() != en) {
      return Status::invalid_argument(
          swhat + " does not match " + mwhat + ": it is " + sh.at("format").dump() + " version " +
          sh.at("version").dump() + ", rank " + sh.at("rank").dump() + " of " +
          sh.at("world_size").dump() + ", elements [" + sh.at("begin").dump() + ", " +
          sh.at("end").dump() + "); the manifest lists rank " + std::to_string(r) + " of " +
          std::to_string(world) + ", [" + std::to_string(b) + ", " + std::to_string(en) + ")");
    }
    if (sh.at("global_step").get<int64_t>() != step) {
      return Status::invalid_argument(swhat + " was saved at global step " +
                                      sh.at("global_step").dump() + "; " + mwhat + " is of step " +
                                      std::to_string(step) + " (files of two saves mixed?)");
    }
    std::vector<float>* dsts[3] = {&out->master, &out->exp_avg, &out->exp_avg_sq};
    const char* names[3] = {"master", "exp_avg", "exp_avg_sq"};
    if (tensors.size() != 3) {
      return Status::invalid_argument(swhat + " holds " + std::to_string(tensors.size()) +
                                      " tensors; a shard has master, exp_avg and exp_avg_sq");
    }
    for (int k = 0; k < 3; ++k) {
      const CheckpointTensor& ct = tensors[static_cast<size_t>(k)];
      if (ct.name != names[k] || ct.dtype != "f32" || ct.shape != std::vector<int64_t>{en - b}) {
        return Status::invalid_argument(
            swhat + ": tensor " + std::to_string(k) + " is \"" + ct.name + "\" (" + ct.dtype +
            ", " + std::to_string(ct.bytes.size() / 4) + " elements); expected \"" + names[k] +
            "\" (f32, " + std::to_string(en - b) + ")");
      }
      std::memcpy(dsts[k]->data() + (a - lo), ct.bytes.data() + (a - b) * 4,
                  static_cast<size_t>(z - a) * sizeof(float));
    }
    // The replicated weights are the gathered master weights of the same save.
    if (std::memcmp(out->master.data() + (a - lo), out->params.data() + a,
                    static_cast<size_t>(z - a) * sizeof(float)) != 0) {
      return Status::invalid_argument(swhat + "'s master weights differ from the weights in " +
                                      rwhat + " (files of two saves mixed?)");
    }
  }
  return Status::ok_status();
}

Status Trainer::load_checkpoint(const std::string& path) {
  SCIATTN_TRY(finish_update());
  // Everything is read and checked before anything changes, and the ranks agree on the outcome,
  // so that a failure leaves every rank's trainer as it was.
  Json h;
  FlatState st;
  SCIATTN_TRY(agree(*comm_, CheckpointIo::read(*this, path, &h, &st),
                    "while reading checkpoint \"" + path + "\""));
  try {
    SCIATTN_TRY(CheckpointIo::apply_state(*this, h));
  } catch (const Json::exception& e) {
    return Status::invalid_argument("checkpoint \"" + path + "\": malformed header: " + e.what());
  }
  // The weights as the optimizer's copy-out would write them, then the master weights, m and v.
  SCIATTN_TRY(model_->set_weights(st.params.data()));
  if (zero_ != nullptr) {
    SCIATTN_TRY(zero_->shard_from_host(ZeroOptimizer::State::kMaster, st.master));
    SCIATTN_TRY(zero_->shard_from_host(ZeroOptimizer::State::kExpAvg, st.exp_avg));
    return zero_->shard_from_host(ZeroOptimizer::State::kExpAvgSq, st.exp_avg_sq);
  }
  if (!master_is_weights_) SCIATTN_TRY(state_from_host(st.master, master_));
  SCIATTN_TRY(state_from_host(st.exp_avg, exp_avg_));
  return state_from_host(st.exp_avg_sq, exp_avg_sq_);
}

}  // namespace sciattn::train
