// The memory diet's modes change memory, not results. Activation recomputation (--recompute): every
// mode, and every mix of modes over the layers, gives the gradients of `none` bit for bit (fp32 on the
// CPU: the recomputation runs the forward's own ops on the same inputs) and keeps less for the backward. Gradient
// accumulation
// (--grad-accum): K micro-batches give the loss, gradients and AdamW step of one batch of them all.
// The logits in chunks: the loss, gradients and step of the logits whole, and none kept. Resident
// weight copies (--weight-copies resident): a graphed step's keys repeat, at the memory they hold. bf16
// masters (--master-dtype bf16) hold 2 bytes a weight and a moment, and no copies.
#include "../common/one_step.h"

#include "lmscope/backend/backend.h"
#include "lmscope/backend/meta/meta_backend.h"
#include "lmscope/core/hash.h"

#include <gtest/gtest.h>

#include <cstring>

namespace lmscope::test {
namespace {

OneStepSpec small_step(AttentionKind attention) {
  OneStepSpec s;
  s.model = tiny_model();
  s.attention = attention;
  s.rows = s.micro = 2;
  s.ctx = 40;
  return s;
}

OneStep cpu_step(const OneStepSpec& s) {
  auto be = make_backend("cpu", "fp32");
  return one_step(*be, s);
}

class DietWith : public ::testing::TestWithParam<AttentionKind> {};
INSTANTIATE_TEST_SUITE_P(Attention, DietWith, ::testing::Values(AttentionKind::naive, AttentionKind::flash),
                         [](const auto& info) { return std::string(attention_name(info.param)); });

// The modes, and mixes of them over the tiny model's 3 layers.
std::vector<RecomputePlan> recomputing_plans() {
  return {Recompute::selective, Recompute::full, RecomputePlan(Recompute::full, 1, Recompute::selective),
          RecomputePlan(Recompute::full, 2, Recompute::none), RecomputePlan(Recompute::selective, 1, Recompute::full)};
}

TEST_P(DietWith, EveryRecomputeModeGivesTheSameGradientsBitForBit) {
  const OneStep none = cpu_step(small_step(GetParam()));
  for (const RecomputePlan& r : recomputing_plans()) {
    OneStepSpec spec = small_step(GetParam());
    spec.recompute = r;
    const OneStep other = cpu_step(spec);
    EXPECT_EQ(std::memcmp(&other.loss, &none.loss, sizeof(double)), 0) << recompute_name(r);
    ASSERT_EQ(other.grads.size(), none.grads.size());
    for (std::size_t i = 0; i < none.grads.size(); ++i)
      EXPECT_EQ(std::memcmp(other.grads[i].data(), none.grads[i].data(), none.grads[i].size() * sizeof(float)), 0)
          << recompute_name(r) << ": parameter " << i;
  }
}

// Up the planner's ladder (none, selective, the first layers in full and the rest selective, full)
// each way keeps less than the one before.
TEST_P(DietWith, RecomputationKeepsLessForTheBackward) {
  std::vector<std::size_t> saved;
  for (const RecomputePlan& r :
       {RecomputePlan(Recompute::none), RecomputePlan(Recompute::selective),
        RecomputePlan(Recompute::full, 1, Recompute::selective),
        RecomputePlan(Recompute::full, 2, Recompute::selective), RecomputePlan(Recompute::full)}) {
    OneStepSpec spec = small_step(GetParam());
    spec.recompute = r;
    saved.push_back(cpu_step(spec).saved_bytes);
    if (saved.size() > 1) {
      EXPECT_LT(saved.back(), saved[saved.size() - 2]) << recompute_name(r);
    }
  }
}

// Within 1e-6 relative (per tensor, in norm): the micro-batches sum their gradients in another
// order than one batch does.
TEST_P(DietWith, AccumulatedMicroBatchesStepAsOneBatch) {
  OneStepSpec spec = small_step(GetParam());
  spec.rows = spec.micro = 6;
  spec.ctx = 24;
  const OneStep whole = cpu_step(spec);
  for (std::int64_t micro : {3, 2, 1}) {
    spec.micro = micro;
    const OneStep parts = cpu_step(spec);
    EXPECT_NEAR(parts.loss, whole.loss, 1e-6 * std::fabs(whole.loss)) << micro;
    EXPECT_LT(largest_relative_difference(parts.grads, whole.grads), 1e-6) << micro;
    EXPECT_LT(largest_relative_difference(parts.params, whole.params), 1e-6) << micro;
  }
}

// Chunks of 3 rows (80 rows: 27 chunks, the last short; 40 in each of two micro-batches), alone and
// with accumulation: the loss and the head's gradient are summed in another order, so equal within
// 1e-6, not bit for bit.
TEST_P(DietWith, TheLogitsInChunksStepAsTheLogitsWhole) {
  OneStepSpec spec = small_step(GetParam());
  const OneStep whole = cpu_step(spec);
  spec.logit_chunk_bytes = 3 * static_cast<std::size_t>(spec.model.vocab) * sizeof(float);
  for (std::int64_t micro : {2, 1}) {
    spec.micro = micro;
    const OneStep chunked = cpu_step(spec);
    EXPECT_NEAR(chunked.loss, whole.loss, 1e-6 * std::fabs(whole.loss)) << micro;
    EXPECT_LT(largest_relative_difference(chunked.grads, whole.grads), 1e-6) << micro;
    EXPECT_LT(largest_relative_difference(chunked.params, whole.params), 1e-6) << micro;
    EXPECT_LT(chunked.saved_bytes, whole.saved_bytes) << "the logits are not kept";
  }
}

// Both at once: micro-batches that recompute step as the whole batch that does not.
TEST_P(DietWith, RecomputationAndAccumulationTogether) {
  OneStepSpec spec = small_step(GetParam());
  spec.rows = spec.micro = 4;
  const OneStep whole = cpu_step(spec);
  for (const RecomputePlan& r : recomputing_plans()) {
    spec.recompute = r;
    spec.micro = 2;
    const OneStep parts = cpu_step(spec);
    EXPECT_NEAR(parts.loss, whole.loss, 1e-6 * std::fabs(whole.loss)) << recompute_name(r);
    EXPECT_LT(largest_relative_difference(parts.grads, whole.grads), 1e-6) << recompute_name(r);
  }
}

TEST(Recompute, NamesParseAndBadOnesAreUserErrors) {
  for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full})
    EXPECT_EQ(parse_recompute(recompute_name(r)), r);
  for (const RecomputePlan& r : recomputing_plans()) EXPECT_EQ(parse_recompute(recompute_name(r)), r);
  EXPECT_EQ(recompute_name(parse_recompute("full:20+selective")), "full:20+selective");
  EXPECT_EQ(recompute_name(parse_recompute("full:20+none")), "full:20");
  const RecomputePlan mix = parse_recompute("full:2+selective");
  EXPECT_EQ(mix.at(0), Recompute::full);
  EXPECT_EQ(mix.at(1), Recompute::full);
  EXPECT_EQ(mix.at(2), Recompute::selective);
  EXPECT_EQ(mix.work(3), 5);
  EXPECT_TRUE(RecomputePlan(Recompute::selective).no_more_than(mix, 3));
  EXPECT_FALSE(mix.no_more_than(RecomputePlan(Recompute::selective), 3));
  EXPECT_NO_THROW(mix.validate(2));
  EXPECT_THROW(mix.validate(1), UserError);
  for (const char* bad : {"some", "full:", "full:0", "full:x+selective", "full:2+some", "full:2+full", "full:2x"})
    EXPECT_THROW(parse_recompute(bad), UserError) << bad;
}

TEST(WeightCopies, NamesParseAndBadOnesAreUserErrors) {
  for (WeightCopies c : {WeightCopies::resident, WeightCopies::kept, WeightCopies::transient})
    EXPECT_EQ(parse_weight_copies(weight_copies_name(c)), c);
  EXPECT_THROW(parse_weight_copies("held"), UserError);
}

// Steps with device graphs as the dry run standing for CUDA takes them (the CUDA backend takes the
// same allocator steps): what each step's forward graph would be keyed by (the model's key and the
// allocator's state), and the step's peak.
struct GraphedSteps {
  std::vector<std::uint64_t> forward_keys;
  std::size_t peak = 0, copy_bytes = 0;  // copy_bytes: every matmul weight's bf16 copy, as allocated
  std::size_t copies_made_in_steps = 0;  // bf16 copies allocated after the setup
  std::vector<int> copy_runs;            // the steps' copy allocations, in runs of ones in a row
};

// The tiny model's bf16 train step on the dry run of CUDA: batch 4, ctx 24, one fixed batch.
RunSpec dry_bf16_spec() {
  RunSpec spec;
  spec.model = tiny_model();
  spec.batch = 4;
  spec.ctx = 24;
  spec.device = "cuda";
  spec.precision = "bf16";
  return spec;
}

// A session of such a spec on the shape-only backend, with its fixed batch (declared first: the
// session reads it as it is built).
struct DryRun {
  explicit DryRun(const RunSpec& spec) : batch(tokens(spec)), session(spec, options(batch)) {}
  static MicroBatchSlices tokens(const RunSpec& spec) {
    const std::int64_t n = spec.batch * spec.ctx;
    std::vector<std::int32_t> ids(static_cast<std::size_t>(n)), targets(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<std::int32_t>(i % 37);
      targets[i] = static_cast<std::int32_t>((i * 7) % 37);
    }
    return MicroBatchSlices(std::move(ids), std::move(targets), n);
  }
  static SessionOptions options(MicroBatchSlices& batch) {
    SessionOptions o;
    o.backend = make_meta_backend(dry_run_target("cuda"), "bf16");
    o.weights = InitialWeights::constant;
    o.first_batch = &batch;
    return o;
  }
  MicroBatchSlices batch;
  Session session;
};

GraphedSteps graphed_steps(WeightCopies copies, int steps) {
  RunSpec spec = dry_bf16_spec();
  spec.weight_copies = copies;
  DryRun run(spec);
  MicroBatchSlices& batch = run.batch;
  Session& session = run.session;
  Allocator& mem = session.backend().allocator();
  GraphedSteps r;
  mem.record_events(true);
  const std::size_t setup_events = mem.events().size();
  for (const Parameter& p : session.model().parameters())
    if (p.spec.matmul) r.copy_bytes += (static_cast<std::size_t>(p.value.tensor().numel()) * 2 + 255) / 256 * 256;
  // Each step's forward key, as the step begins.
  struct Keys : StepObserver {
    Transformer& model;
    Allocator& mem;
    std::vector<std::uint64_t>& keys;
    Keys(Transformer& m, Allocator& a, std::vector<std::uint64_t>& k) : model(m), mem(a), keys(k) {}
    void step_begin(std::int64_t) override { keys.push_back(hash_mix(model.graph_key("forward"), mem.state_hash())); }
  } keys(session.model(), mem, r.forward_keys);
  StepDriver driver(session, batch, false);
  driver.add_observer(keys);
  for (int step = 0; step < steps; ++step) driver.step(step, step);
  r.peak = mem.peak_bytes();
  const auto& events = mem.events();
  bool in_run = false;
  for (std::size_t i = setup_events; i < events.size(); ++i) {
    const bool copy = events[i].action == MemAction::alloc && events[i].tag.what.ends_with("(bf16 copy)");
    if (copy) ++r.copies_made_in_steps;
    if (copy && !in_run) r.copy_runs.push_back(0);
    if (copy) ++r.copy_runs.back();
    in_run = copy;
  }
  return r;
}

// Resident copies never move, so from the second step on every forward finds the allocator as the
// last one did and its graph would replay, as with kept copies (which graphs have each forward cast,
// for that reason); no step makes a copy. They cost at most the copies' bytes more
// at the peak.
TEST(WeightCopies, ResidentCopiesNeverMoveSoGraphedStepsRepeatTheirKeys) {
  const int steps = 8;
  const GraphedSteps resident = graphed_steps(WeightCopies::resident, steps),
                     kept = graphed_steps(WeightCopies::kept, steps);
  for (int step = 2; step < steps; ++step) {
    EXPECT_EQ(resident.forward_keys[step], resident.forward_keys[1]) << step;
    EXPECT_EQ(kept.forward_keys[step], kept.forward_keys[1]) << step;
  }
  EXPECT_EQ(resident.copies_made_in_steps, 0u) << "a step cast a copy of its own";
  EXPECT_GT(kept.copies_made_in_steps, 0u) << "kept copies under graphs are cast by each forward";
  EXPECT_GE(resident.peak, kept.peak);
  EXPECT_LE(resident.peak, kept.peak + resident.copy_bytes);
}

// Kept copies under graphs are cast by each forward; a layer's seven are allocated together, at the
// layer's start (then cast in one cast_all, one launch on CUDA, whose bits a GPU test checks), rather
// than each where it is first used; the LM head's alone.
TEST(WeightCopies, AForwardCastsALayersKeptCopiesAtOnce) {
  const int steps = 3;
  const GraphedSteps kept = graphed_steps(WeightCopies::kept, steps);
  const int layers = static_cast<int>(tiny_model().layers);
  std::vector<int> step_runs(static_cast<std::size_t>(layers), 7);
  step_runs.push_back(1);
  std::vector<int> want;
  for (int step = 0; step < steps; ++step) want.insert(want.end(), step_runs.begin(), step_runs.end());
  EXPECT_EQ(kept.copy_runs, want);
  EXPECT_TRUE(graphed_steps(WeightCopies::resident, steps).copy_runs.empty());
}

// bf16 masters on the dry run (the shapes the CUDA run allocates): parameters and AdamW's moments of
// 2 bytes, none of the copies mixed precision keeps, and a lower peak than fp32 masters'.
TEST(Bf16Masters, HoldTheWeightsAndMomentsInTwoBytesAndNoCopies) {
  struct Held {
    std::size_t parameters = 0, moments = 0, expected_parameters = 0, peak = 0;
    int copies = 0;
  };
  const auto train_step = [](DType masters) {
    RunSpec spec = dry_bf16_spec();
    spec.master_dtype = masters;
    DryRun run(spec);
    Session& session = run.session;
    Allocator& mem = session.backend().allocator();
    mem.record_events(true);
    StepDriver driver(session, run.batch, false);
    driver.step(0, 0);
    Held h;
    h.parameters = mem.current_bytes(MemKind::parameter);
    h.moments = mem.current_bytes(MemKind::optimizer_state);
    h.peak = mem.peak_bytes();
    for (const Parameter& p : session.model().parameters()) {
      EXPECT_EQ(p.value.tensor().dtype, masters) << p.spec.name;
      h.expected_parameters += Allocator::rounded_bytes(static_cast<std::size_t>(p.value.tensor().numel()) * 2);
    }
    for (const MemEvent& e : mem.events())
      if (e.action == MemAction::alloc && e.tag.what.ends_with("(bf16 copy)")) ++h.copies;
    return h;
  };
  const Held bf16 = train_step(DType::bf16), fp32 = train_step(DType::f32);
  EXPECT_EQ(bf16.parameters, bf16.expected_parameters);
  EXPECT_EQ(bf16.moments, 2 * bf16.expected_parameters);
  EXPECT_EQ(bf16.copies, 0);
  EXPECT_GT(fp32.copies, 0);  // the mixed-precision run makes copies, so the count above can see them
  EXPECT_GT(fp32.parameters, bf16.parameters);
  EXPECT_GT(fp32.moments, bf16.moments);
  EXPECT_LT(bf16.peak, fp32.peak);
}

}  // namespace
}  // namespace lmscope::test
