// The one small model of the tests. A test that needs another shape derives it from this one, with
// the field changed and why.
#pragma once

#include "lmscope/model/config.h"

namespace lmscope::test {

// Three layers of width 32 over a vocabulary of 37: a step of it takes the CPU milliseconds.
inline ModelConfig tiny_model() {
  ModelConfig c;
  c.name = "tiny";
  c.vocab = 37;
  c.d_model = 32;
  c.d_ff = 48;
  c.layers = 3;
  c.heads = 2;
  return c;
}

// The GPU tests' model: tiny_model() widened so that its matrix products and attention take the GPU's
// kernels as real models do (d_head 32: the Hopper flash kernels under bf16), over an odd vocabulary.
inline ModelConfig gpu_model() {
  ModelConfig c = tiny_model();
  c.name = "tiny-gpu";
  c.vocab = 503;
  c.d_model = 128;
  c.d_ff = 344;
  c.layers = 2;
  c.heads = 4;
  return c;
}

}  // namespace lmscope::test
