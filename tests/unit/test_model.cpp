// The whole model: gradient against finite differences (f64), preset sizes, seeded
// initialisation (kept values too), the schedule, and the allocator's record of what the model holds.
#include "../common/training.h"
#include "gradcheck.h"

#include "lmscope/bench/runner.h"
#include "lmscope/model/optimizer.h"
#include "lmscope/model/transformer.h"

namespace lmscope::test {
namespace {

// tiny_model() shrunk: the finite differences perturb every parameter (1.5 thousand here, 29 thousand
// in tiny_model()), two forwards each; RoPE's theta 100 turns its angles within 5 positions.
ModelConfig tiny() {
  ModelConfig c = tiny_model();
  c.vocab = 11;
  c.d_model = 8;
  c.d_ff = 12;
  c.layers = 2;
  c.rope_theta = 100;
  return c;
}

struct TinyBatch {
  std::vector<std::int32_t> ids, targets;
  TinyBatch(std::int64_t n, std::int64_t vocab, std::uint64_t seed) {
    Rng rng(seed);
    for (std::int64_t i = 0; i < n; ++i) {
      ids.push_back(static_cast<std::int32_t>(rng.below(vocab)));
      targets.push_back(static_cast<std::int32_t>(rng.below(vocab)));
    }
  }
};

class ModelWith : public ::testing::TestWithParam<AttentionKind> {};
INSTANTIATE_TEST_SUITE_P(Attention, ModelWith, ::testing::Values(AttentionKind::naive, AttentionKind::flash),
                         [](const auto& info) { return std::string(attention_name(info.param)); });

TEST_P(ModelWith, GradientOfEveryParameterMatchesFiniteDifferences) {
  auto be = make_cpu_backend();
  Transformer model(tiny(), *be, DType::f64, std::nullopt, GetParam());
  model.init_parameters(3);
  // Norm weights start at ones; perturb them so their gradients are generic.
  Rng rng(5);
  for (Parameter& p : model.parameters())
    if (p.spec.init_std == 0)
      for (std::int64_t i = 0; i < p.value.tensor().numel(); ++i)
        p.value.tensor().as<double>()[i] += 0.3 * rng.normal();
  const std::int64_t B = 2, T = 5;
  TinyBatch batch(B * T, 11, 9);
  model.set_batch(B, T, batch.ids.data(), batch.targets.data());
  model.forward();
  model.backward();
  auto loss = [&] {
    model.forward();
    double l = model.read_loss();
    model.discard_activations();
    return l;
  };
  for (Parameter& p : model.parameters()) expect_gradient(p.spec.name, p.value, p.grad, loss, 1e-5);
  EXPECT_EQ(be->allocator().current_bytes(MemKind::activation), 0u) << "backward must free every saved activation";
}

TEST_P(ModelWith, AllocatorRecordsWhatTheModelHoldsAndWhen) {
  auto be = make_cpu_backend();
  Allocator& mem = be->allocator();
  mem.record_events(true);
  Transformer model(tiny(), *be, DType::f32, std::nullopt, GetParam());
  model.init_parameters(1);
  AdamW opt(model, {});
  TinyBatch batch(2 * 4, 11, 2);
  model.set_batch(2, 4, batch.ids.data(), batch.targets.data());
  model.forward();
  const std::size_t activations = mem.current_bytes(MemKind::activation);
  EXPECT_GT(activations, 0u);
  EXPECT_EQ(mem.current_bytes(MemKind::gradient), 0u) << "gradients are made by the backward";
  model.backward();
  EXPECT_EQ(mem.current_bytes(MemKind::activation), 0u);
  EXPECT_EQ(mem.current_bytes(MemKind::gradient), mem.current_bytes(MemKind::parameter));
  opt.step(1e-3);
  EXPECT_EQ(mem.current_bytes(MemKind::gradient), 0u) << "AdamW frees each gradient once read";
  EXPECT_EQ(mem.current_bytes(MemKind::optimizer_state), 2 * mem.current_bytes(MemKind::parameter));
  // naive keeps the probabilities, flash only the log-sum-exp; neither keeps the other's.
  const std::string kept = GetParam() == AttentionKind::naive ? "attn.probs" : "attn.lse";
  const std::string absent = GetParam() == AttentionKind::naive ? "attn.lse" : "attn.probs";
  bool saw_kept_in_layer1 = false, saw_absent = false, saw_grad_in_backward = false;
  for (const MemEvent& e : mem.events()) {
    if (e.action == MemAction::alloc && e.tag.what == kept && e.tag.layer == 1 && e.phase == Phase::forward)
      saw_kept_in_layer1 = true;
    if (e.action == MemAction::alloc &&
        (e.tag.what == absent || (GetParam() == AttentionKind::flash && e.tag.what == "attn.scores")))
      saw_absent = true;
    if (e.action == MemAction::alloc && e.tag.kind == MemKind::gradient && e.phase == Phase::backward)
      saw_grad_in_backward = true;
  }
  EXPECT_TRUE(saw_kept_in_layer1) << kept;
  EXPECT_FALSE(saw_absent) << absent;
  EXPECT_TRUE(saw_grad_in_backward);
  EXPECT_GE(mem.peak_bytes(), mem.current_bytes() + activations / 2);
}

// Exactly the accounting of docs/design.md: per layer, naive saves B·h·T² probabilities where
// flash saves B·h·T log-sum-exps; everything else is the same.
TEST(Model, FlashSavesLinearInsteadOfQuadraticMemory) {
  const std::int64_t B = 2, T = 64;  // sizes that are multiples of the allocator's 256-byte rounding
  ModelConfig c = tiny();
  c.d_model = 16;
  c.heads = 2;
  TinyBatch batch(B * T, 11, 3);
  std::size_t saved[2] = {};
  for (AttentionKind kind : {AttentionKind::naive, AttentionKind::flash}) {
    auto be = make_cpu_backend();
    Transformer model(c, *be, DType::f32, std::nullopt, kind);
    model.init_parameters(1);
    model.set_batch(B, T, batch.ids.data(), batch.targets.data());
    model.forward();
    saved[kind == AttentionKind::flash] = be->allocator().current_bytes(MemKind::activation);
  }
  const std::size_t per_layer = static_cast<std::size_t>(B * c.heads * (T * T - T)) * sizeof(float);
  EXPECT_EQ(saved[0] - saved[1], static_cast<std::size_t>(c.layers) * per_layer);
}

// fp32 training with flash tracks naive: the same algorithm up to summation order.
TEST(Model, FlashTrainsLikeNaive) {
  ModelConfig c = tiny();
  c.d_model = 32;
  c.heads = 2;
  c.d_ff = 48;
  const std::int64_t B = 2, T = 70;  // two key tiles, the second partial
  TinyBatch batch(B * T, 11, 4);
  auto be = make_cpu_backend();
  const std::vector<double> losses[2] = {
      twenty_step_losses(*be, c, std::nullopt, B, T, batch.ids, batch.targets, AttentionKind::naive),
      twenty_step_losses(*be, c, std::nullopt, B, T, batch.ids, batch.targets, AttentionKind::flash)};
  EXPECT_LT(losses[0].back(), losses[0].front() - 0.1) << "the run must train for the comparison to mean anything";
  for (int i = 0; i < 20; ++i) EXPECT_NEAR(losses[1][i], losses[0][i], 1e-4 * std::fabs(losses[0][i])) << "step " << i;
}

TEST(Model, PresetParameterCountsMatchTheAssignment) {
  const std::pair<const char*, std::int64_t> expected[] = {
      {"small", 128625408}, {"medium", 423183360}, {"large", 969411840}, {"xl", 1998235200}, {"2.7B", 3406809600}};
  for (auto [name, count] : expected) {
    ModelConfig c = preset(name);
    EXPECT_EQ(c.parameter_count(), count) << name;
    std::int64_t sum = 0;
    for (const auto& s : parameter_specs(c)) sum += shape_numel(s.shape);
    EXPECT_EQ(sum, count) << name << ": the tensor list must add up to the formula";
  }
  EXPECT_EQ(preset("2.7B").d_head(), 80);
  EXPECT_THROW(preset("huge"), UserError);
}

// The 2026 handout's 10B and the 2026 leaderboard's 8B (its vocabulary of 151,936 with the preset):
// their shapes as published, their counts from the tensor list, and the 2025 table as plan's default.
TEST(Model, The2026PresetsHaveTheirPublishedShapes) {
  const ModelConfig ten = preset("10B"), eight = preset("8B-leaderboard");
  const auto shape = [](const ModelConfig& c) {
    return std::vector<std::int64_t>{c.d_model, c.d_ff, c.layers, c.heads, c.vocab};
  };
  EXPECT_EQ(shape(ten), (std::vector<std::int64_t>{4608, 12288, 50, 36, 10000}));
  EXPECT_EQ(shape(eight), (std::vector<std::int64_t>{4096, 11008, 34, 32, 151936}));
  EXPECT_EQ(eight.d_head(), 128);
  for (const ModelConfig& c : {ten, eight}) {
    std::int64_t sum = 0;
    for (const auto& s : parameter_specs(c)) sum += shape_numel(s.shape);
    EXPECT_EQ(sum, c.parameter_count()) << c.name;
  }
  EXPECT_EQ(eight.parameter_count(), 8125698048);
  EXPECT_EQ(preset_names(), (std::vector<std::string>{"small", "medium", "large", "xl", "2.7B"}));
  EXPECT_EQ(all_preset_names().size(), 7u);
}

TEST(Model, InvalidShapesAreUserErrors) {
  ModelConfig c = tiny();
  c.heads = 3;  // 8 not divisible by 3
  EXPECT_THROW(c.validate(), UserError);
  c = tiny();
  c.layers = -1;
  EXPECT_THROW(c.validate(), UserError);
}

TEST(Model, InitialisationIsSeededAndTruncated) {
  auto be = make_cpu_backend();
  Transformer a(tiny(), *be), b(tiny(), *be), c(tiny(), *be);
  a.init_parameters(7);
  b.init_parameters(7);
  c.init_parameters(8);
  bool differs = false;
  for (std::size_t i = 0; i < a.parameters().size(); ++i) {
    auto va = download(*be, a.parameters()[i].value), vb = download(*be, b.parameters()[i].value),
         vc = download(*be, c.parameters()[i].value);
    EXPECT_EQ(va, vb) << a.parameters()[i].spec.name;
    differs |= va != vc;
    const double std = a.parameters()[i].spec.init_std;
    for (double x : va) {
      if (std == 0)
        EXPECT_EQ(x, 1.0);
      else
        EXPECT_LE(std::fabs(x), 3 * std + 1e-6);
    }
  }
  EXPECT_TRUE(differs) << "another seed must give other weights";
}

// bench's cells build the same model again and again: kept values are the ones drawn, copied while
// the seed and the tensors stay, drawn anew when either changes.
TEST(Model, KeptInitialValuesAreCopiedUntilTheSeedOrModelChanges) {
  auto be = make_cpu_backend();
  const auto values = [&](Transformer& m) {
    std::vector<std::vector<double>> v;
    for (Parameter& p : m.parameters()) v.push_back(download(*be, p.value));
    return v;
  };
  const auto drawn = [&](const ModelConfig& config, std::uint64_t seed) {
    Transformer m(config, *be);
    m.init_parameters(seed);
    return values(m);
  };
  KeptInitialValues kept;
  Transformer a(tiny(), *be);
  a.init_parameters(7, &kept);
  EXPECT_EQ(values(a), drawn(tiny(), 7));
  EXPECT_EQ(kept.tensors.size(), a.parameters().size());

  const std::string first = a.parameters().front().spec.name;
  kept.tensors.at(first).values[0] = 42.0f;  // a copy shows it; a new draw would not
  Transformer b(tiny(), *be);
  b.init_parameters(7, &kept);
  EXPECT_EQ(values(b)[0][0], 42.0);

  Transformer c(tiny(), *be);
  c.init_parameters(8, &kept);
  EXPECT_EQ(values(c), drawn(tiny(), 8));
  EXPECT_EQ(kept.seed, 8u);

  ModelConfig wider = tiny();
  wider.d_ff = 16;
  kept.tensors.at(first).values[0] = 42.0f;
  Transformer d(wider, *be);
  d.init_parameters(8, &kept);
  EXPECT_EQ(values(d), drawn(wider, 8));
}

// A sweep keeps them between cells of one model and seed on a GPU, never on the CPU.
TEST(Model, SweepsKeepInitialWeightsOnlyBetweenCellsOfOneModelOnAGpu) {
  BenchSpec a;
  a.model = preset("small");
  a.device = "cuda";
  BenchSpec b = a;
  b.ctx = 2 * a.ctx;  // lengths, precision and switches draw the same weights
  b.graphs = !a.graphs;
  EXPECT_TRUE(keeps_initial_weights(a, b));
  b.seed = a.seed + 1;
  EXPECT_FALSE(keeps_initial_weights(a, b));
  b = a;
  b.model = preset("medium");
  EXPECT_FALSE(keeps_initial_weights(a, b));
  a.device = b.device = "cpu";
  b.model = a.model;
  EXPECT_FALSE(keeps_initial_weights(a, b));
}

TEST(Model, AGradientShardFindsEachPieceInThePartThatHoldsIt) {
  // ZeRO-2 and 3 add a part per bucket as the bucket becomes final, not in the shard's order.
  auto be = make_cpu_backend();
  auto part = [&](std::int64_t n, double first) {
    Allocation a = be->allocator().allocate({n}, DType::f32, {MemKind::gradient, "part", -1});
    std::vector<double> v(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = first + static_cast<double>(i);
    upload(*be, a, v);
    return a;
  };
  GradientShard shard;
  shard.add(10, part(5, 100));  // elements 10-14
  shard.add(0, part(4, 0));     // 0-3
  shard.add(4, part(6, 40));    // 4-9
  ASSERT_EQ(shard.parts().size(), 3u);
  EXPECT_EQ(shard.parts()[0].numel(), 4);  // in the shard's order
  EXPECT_EQ(download(*be, shard.rows(5, 3)), (std::vector<double>{41, 42, 43}));
  EXPECT_EQ(download(*be, shard.rows(12, 3)), (std::vector<double>{102, 103, 104}));
  EXPECT_EQ(download(*be, shard.rows(0, 4)), (std::vector<double>{0, 1, 2, 3}));
  EXPECT_THROW(shard.add(8, part(3, 0)), std::exception);  // overlaps 4-9
  EXPECT_THROW(shard.rows(8, 4), std::exception);          // crosses from one part into the next
  shard.add(15, part(1, 7));
  EXPECT_EQ(download(*be, shard.rows(15, 1)), (std::vector<double>{7}));
}

TEST(Model, CosineScheduleFollowsTheFormula) {
  LrSchedule s{.cosine = true, .lr_max = 1.0, .lr_min = 0.1, .warmup_iters = 10, .cosine_iters = 110};
  EXPECT_DOUBLE_EQ(s.at(0), 0.0);
  EXPECT_DOUBLE_EQ(s.at(5), 0.5);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);
  EXPECT_DOUBLE_EQ(s.at(500), 0.1);
  LrSchedule constant{.lr_max = 0.3};
  EXPECT_DOUBLE_EQ(constant.at(1000), 0.3);
}

TEST(Model, TrainingLowersTheLossOnARepeatedBatch) {
  RunSpec spec;
  spec.model = tiny();
  spec.batch = 2;
  spec.ctx = 6;
  spec.graphs = false;
  spec.seed = 4;
  spec.optimizer = {.lr = 1e-2, .loss_scaling = {}};
  spec.schedule.lr_max = 1e-2;
  Session session(spec);
  FixedBatch batch(spec.model.vocab, spec.batch, spec.ctx, 8, "test");
  StepDriver driver(session, batch, true);
  const double first = driver.step(0, 0).loss;
  double last = first;
  for (int i = 1; i < 30; ++i) last = driver.step(i, i).loss;
  EXPECT_LT(last, first - 0.5);
}

}  // namespace
}  // namespace lmscope::test
