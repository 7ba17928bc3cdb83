"""transformers, built from configs (nothing downloaded): GPT-2 generating with its KV cache
(greedy), then a BERT classifier's training steps with AdamW and a linear warm-up schedule."""
import torch
from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
gpt = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=64)).cuda().eval()
prompt = torch.randint(0, 512, (2, 8), device="cuda")
with torch.no_grad():
    out = gpt.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False,
                       pad_token_id=0)
tokens = out[:, 8:].sum().item()

bert = BertForSequenceClassification(BertConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2,
                                                num_attention_heads=4, intermediate_size=128,
                                                num_labels=3)).cuda()
opt = torch.optim.AdamW(bert.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))
ids = torch.randint(0, 512, (4, 32), device="cuda")
mask = torch.ones_like(ids)
mask[:, 24:] = 0
labels = torch.tensor([0, 1, 2, 1], device="cuda")
for _ in range(4):
    loss = bert(input_ids=ids, attention_mask=mask, labels=labels).loss
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(bert.parameters(), 1.0)
    opt.step()
    sched.step()
print("ZOO result", tokens, f"{loss.item():.6g}")
