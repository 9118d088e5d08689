// Test tool for the PyTorch parity test: loads weights, takes the first sequential batch of a
// token file, runs forward and backward in fp32, and writes logits, loss and every gradient
// ("grad.<parameter name>") to a safetensors file for the Python side to compare.
#include "lmscope/backend/backend.h"
#include "lmscope/io/safetensors.h"
#include "lmscope/io/token_data.h"
#include "lmscope/model/transformer.h"

#include <CLI/CLI.hpp>

int main(int argc, char** argv) {
  using namespace lmscope;
  CLI::App app{"lmscope parity probe"};
  ModelConfig c;
  std::string init, data, out, fusion = "on";
  std::int64_t batch = 2, ctx = 8;
  app.add_option("--vocab", c.vocab);
  app.add_option("--d-model", c.d_model);
  app.add_option("--d-ff", c.d_ff);
  app.add_option("--layers", c.layers);
  app.add_option("--heads", c.heads);
  app.add_option("--rope-theta", c.rope_theta);
  app.add_option("--init", init)->required();
  app.add_option("--data", data)->required();
  app.add_option("--out", out)->required();
  app.add_option("--batch", batch);
  app.add_option("--ctx", ctx);
  app.add_option("--fusion", fusion)->check(CLI::IsMember({"on", "off"}));
  CLI11_PARSE(app, argc, argv);

  auto be = make_cpu_backend();
  Transformer model(c, *be);
  model.set_fusion(fusion == "on");
  load_parameters(model, init);
  TokenData tokens(data);
  BatchSampler sampler(tokens, batch, ctx, true, 0);
  std::vector<std::int32_t> ids(batch * ctx), targets(batch * ctx);
  sampler.next(ids.data(), targets.data());
  model.set_batch(batch, ctx, ids.data(), targets.data());
  model.forward();
  auto to_f32 = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  std::vector<NamedTensorData> result;
  result.push_back({"logits", model.logits().shape, to_f32(download(*be, model.logits()))});
  result.push_back({"loss", {1}, {static_cast<float>(model.read_loss())}});
  model.backward();
  for (Parameter& p : model.parameters())
    result.push_back({"grad." + p.spec.name, p.spec.shape, to_f32(download(*be, p.grad))});
  write_safetensors(out, result);
  return 0;
}
