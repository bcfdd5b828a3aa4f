"""What the checkpoint checksums (sources.tensor_checksums, CRC-32 of every tensor) add to a durable save: a 45M-parameter
GPT's weights and AdamW moments (538 MB) saved five times with and without them. Run from the repo root:
python docs/checksum_cost.py (writes and leaves ./ckpt_cost.pt)."""
import statistics, sys, time, torch
sys.path.insert(0, '.')
from common import save_checkpoint
from model import GPT, GPTConfig
from sources import tensor_checksums
torch.manual_seed(0)
model = GPT(GPTConfig(n_layer=6, n_head=8, n_embd=512, block_size=256, vocab_size=50257, operator='corridor'))
opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu')
model(torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long))[1].backward(); opt.step()
state = dict(model=model.state_dict(), optimizer=opt.state_dict())
n = sum(t.numel() * t.element_size() for t in state['model'].values())
plain, checked, crc = [], [], []
for _ in range(5):
    t0 = time.perf_counter(); save_checkpoint(state, 'ckpt_cost.pt'); plain.append(time.perf_counter() - t0)
    t0 = time.perf_counter(); c = tensor_checksums(state); crc.append(time.perf_counter() - t0)
    save_checkpoint(state | dict(checksums=c), 'ckpt_cost.pt'); checked.append(time.perf_counter() - t0)
import os
print(f"file {os.path.getsize('ckpt_cost.pt')/1e6:.0f} MB; save median {statistics.median(plain):.3f}s, "
      f"with checksums {statistics.median(checked):.3f}s, checksums alone {statistics.median(crc):.3f}s, "
      f"ratio {statistics.median(checked)/statistics.median(plain):.3f}")
