"""A small llama-architecture GGUF with random weights, written with the `gguf` package, that tinygrad.llm loads: a byte-level BPE
vocabulary (every byte a token, so any text encodes, then letter pairs up to the size asked, then Llama 3's special tokens) with the
tokenizer metadata tinygrad/llm/cli.py's SimpleTokenizer reads, float16 attention weights and embeddings, float32 norms, and the
feed-forward and attention output weights in Q8_0 (gguf.quants), so that dequantization kernels run on the device that loads it.

  python tests/ggufgen.py OUT.gguf [--blocks 2 --dim 64 --ffn 128 --heads 4 --kv-heads 2 --vocab 320 --context 256 --seed 0]
"""
from __future__ import annotations
import argparse, itertools, string
import numpy as np

SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
QUANTIZED = ("ffn_gate", "ffn_up", "ffn_down", "attn_output")   # Q8_0: rows of a multiple of 32 values

def byte_chars() -> list[str]:
  """GPT-2's byte-to-character map (the inverse of SimpleTokenizer._byte_decoder): token text for each byte 0..255."""
  bs = [*range(33, 127), *range(161, 173), *range(174, 256)]
  extra = iter(chr(256 + i) for i in range(256))
  return [chr(b) if b in bs else next(extra) for b in range(256)]

def vocabulary(size:int) -> tuple[list[str], list[int]]:
  chars = byte_chars()
  words = ["Hello", chars[32] + "world", chars[32] + "the", "he", "ll", "lo", chars[32] + "a"]
  pairs = ("".join(p) for p in itertools.product(string.ascii_letters, repeat=2))
  normal = chars + [w for w in words if w not in chars]
  normal += list(itertools.islice((p for p in pairs if p not in normal), max(0, size - len(SPECIAL) - len(normal))))
  return normal + SPECIAL, [1] * len(normal) + [3] * len(SPECIAL)

def write(path:str, blocks:int=2, dim:int=64, ffn:int=128, heads:int=4, kv_heads:int=2, vocab:int=320, context:int=256, seed:int=0) -> str:
  import gguf
  assert dim % heads == 0 and dim % 32 == 0 and ffn % 32 == 0, "Q8_0 rows are multiples of 32 values"
  tokens, types = vocabulary(vocab)
  g, hd, Q8_0 = np.random.default_rng(seed), dim // heads, gguf.GGMLQuantizationType.Q8_0
  w = gguf.GGUFWriter(path, "llama")
  w.add_name("ggufgen-llama")
  w.add_block_count(blocks)
  w.add_context_length(context)
  w.add_embedding_length(dim)
  w.add_feed_forward_length(ffn)
  w.add_head_count(heads)
  w.add_head_count_kv(kv_heads)
  w.add_layer_norm_rms_eps(1e-5)
  w.add_rope_freq_base(10000.0)
  w.add_rope_dimension_count(hd)
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre("llama-bpe")
  w.add_token_list(tokens)
  w.add_token_types(types)
  w.add_bos_token_id(tokens.index("<|begin_of_text|>"))
  w.add_eos_token_id(tokens.index("<|eot_id|>"))
  def mat(name:str, rows:int, cols:int):
    a = (g.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float32)
    if name.split(".")[-2] in QUANTIZED: w.add_tensor(name, gguf.quants.quantize(a, Q8_0), raw_dtype=Q8_0)
    else: w.add_tensor(name, a.astype(np.float16))
  def norm(name:str): w.add_tensor(name, (1 + 0.1 * g.standard_normal(dim, dtype=np.float32)).astype(np.float32))
  mat("token_embd.weight", len(tokens), dim)
  for i in range(blocks):
    norm(f"blk.{i}.attn_norm.weight")
    mat(f"blk.{i}.attn_q.weight", dim, dim)
    mat(f"blk.{i}.attn_k.weight", kv_heads * hd, dim)
    mat(f"blk.{i}.attn_v.weight", kv_heads * hd, dim)
    mat(f"blk.{i}.attn_output.weight", dim, dim)
    norm(f"blk.{i}.ffn_norm.weight")
    mat(f"blk.{i}.ffn_gate.weight", ffn, dim)
    mat(f"blk.{i}.ffn_up.weight", ffn, dim)
    mat(f"blk.{i}.ffn_down.weight", dim, ffn)
  norm("output_norm.weight")
  mat("output.weight", len(tokens), dim)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path

if __name__ == "__main__":
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("out")
  for k, v in dict(blocks=2, dim=64, ffn=128, heads=4, kv_heads=2, vocab=320, context=256, seed=0).items():
    p.add_argument(f"--{k.replace('_', '-')}", type=int, default=v)
  a = vars(p.parse_args())
  print(write(a.pop("out"), **a))
