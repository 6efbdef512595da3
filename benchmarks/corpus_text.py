"""The corpus's language workloads: transformer language models built from
their configurations with random weights (Hugging Face transformers;
nothing downloaded), generation with a growing key-value cache, and RNNs
over sequences of varying length. Registered in corpus_workloads.WORKLOADS
(its docstring says how a workload is made and recorded)."""

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from corpus_workloads import adam, adamw, sgd, to_device, train_step, workload


def padded_batch(data, lengths, vocab, multiple=8):
    """(ids, attention mask) of sequences of ``lengths`` tokens, padded on
    the right to the longest rounded up to ``multiple`` (dynamic padding)."""
    longest = -(-max(lengths) // multiple) * multiple
    ids = torch.randint(1, vocab, (len(lengths), longest), generator=data)
    mask = torch.zeros(len(lengths), longest, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    return ids * mask, mask


def pair_batches(shapes, data, steps, batch, sources, targets, vocab):
    """``steps`` batches of ``batch`` (source, target) pairs as a
    sequence-to-sequence model takes them (input_ids, attention_mask,
    labels: -100 on padding): each batch draws its longest source from
    ``sources`` (least, lowest longest, highest longest) and its sources'
    lengths from least to it, its targets alike from ``targets``."""
    out = []
    for _ in range(steps):
        source, target = shapes.randint(*sources[1:]), shapes.randint(*targets[1:])
        ids, mask = padded_batch(data, [shapes.randint(sources[0], source) for _ in range(batch)],
                                 vocab)
        labels, label_mask = padded_batch(
            data, [shapes.randint(targets[0], target) for _ in range(batch)], vocab)
        out.append({"input_ids": ids, "attention_mask": mask,
                    "labels": torch.where(label_mask == 1, labels, -100)})
    return out


def lm_training(model, inputs):
    """Train a Hugging Face model on dicts of its inputs (labels among
    them), AdamW."""
    model.train()
    opt = adamw(model)
    for batch in inputs:
        batch = to_device(batch)
        loss = model(**batch).loss
        train_step(opt, loss)


# -- encoders and encoder-decoders -------------------------------------------------------------

@workload("bert-train", "encoder language model",
          "transformers BertForMaskedLM from a config (6 layers of width 512, 8 heads, "
          "30,522 tokens), masked-LM training, AdamW, batches of 16 sentences of 16-256 "
          "tokens drawn each, padded to the batch's longest, 10 steps")
def bert_train(shapes, data):
    from transformers import BertConfig, BertForMaskedLM
    config = BertConfig(hidden_size=512, num_hidden_layers=6, num_attention_heads=8,
                        intermediate_size=2048)
    inputs = []
    for _ in range(10):
        top = shapes.randint(32, 256)
        ids, mask = padded_batch(data, [shapes.randint(16, top) for _ in range(16)],
                                 config.vocab_size)
        chosen = (torch.rand(ids.shape, generator=data) < 0.15) & (mask == 1)
        inputs.append({"input_ids": torch.where(chosen, 103, ids), "attention_mask": mask,
                       "labels": torch.where(chosen, ids, -100)})
    return BertForMaskedLM(config), inputs, lm_training


@workload("t5-train", "encoder language model",
          "transformers T5ForConditionalGeneration from a config (4 + 4 layers of width 384, "
          "6 heads, 32,128 tokens), training, AdamW, batches of 8 pairs: sources of 16-256 "
          "tokens, targets of 4-128, padded to each batch's longest, 10 steps")
def t5_train(shapes, data):
    from transformers import T5Config, T5ForConditionalGeneration
    config = T5Config(d_model=384, d_kv=64, d_ff=1536, num_layers=4, num_decoder_layers=4,
                      num_heads=6, decoder_start_token_id=0)
    inputs = pair_batches(shapes, data, 10, 8, (16, 32, 256), (4, 8, 128), config.vocab_size)
    return T5ForConditionalGeneration(config), inputs, lm_training


# -- decoders: training -------------------------------------------------------------------------

def causal_batches(steps, batch, vocab, shapes, data):
    """``steps`` batches of ``batch`` sequences of 64-512 tokens (one
    length a batch, drawn per step: packed text)."""
    batches = []
    for _ in range(steps):
        ids = torch.randint(0, vocab, (batch, shapes.randrange(64, 513, 8)), generator=data)
        batches.append({"input_ids": ids, "labels": ids})
    return batches


def gpt2_config():
    from transformers import GPT2Config
    return GPT2Config(n_layer=6, n_embd=512, n_head=8)


def llama_config():
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1408,
                       num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4,
                       max_position_embeddings=2048, pad_token_id=0)


def causal_lm(model_class, config, shapes, data):
    """``model_class(config)`` trained with AdamW on 10 causal_batches of 4."""
    return (model_class(config), causal_batches(10, 4, config.vocab_size, shapes, data),
            lm_training)


@workload("gpt2-train", "decoder language model",
          "transformers GPT2LMHeadModel from a config (6 layers of width 512, 8 heads, "
          "50,257 tokens), training, AdamW, batches of 4 sequences of 64-512 tokens drawn per "
          "step, 10 steps")
def gpt2_train(shapes, data):
    from transformers import GPT2LMHeadModel
    return causal_lm(GPT2LMHeadModel, gpt2_config(), shapes, data)


@workload("llama-train", "decoder language model",
          "transformers LlamaForCausalLM from a config (6 layers of width 512, 8 query and 4 "
          "key-value heads, SwiGLU 1408, 32,000 tokens), training, AdamW, batches of 4 "
          "sequences of 64-512 tokens drawn per step, 10 steps")
def llama_train(shapes, data):
    from transformers import LlamaForCausalLM
    return causal_lm(LlamaForCausalLM, llama_config(), shapes, data)


# -- decoders: generation -----------------------------------------------------------------------

def generation(requests, vocab, shapes, data):
    """(inputs, run): ``requests`` requests of 1-16 prompts of 8-128 tokens
    (left-padded), each answered by greedy decoding of 16-48 new tokens
    with a key-value cache."""
    inputs = []
    for _ in range(requests):
        lengths = [shapes.randint(8, 128) for _ in range(shapes.randint(1, 16))]
        ids, mask = padded_batch(data, lengths, vocab, multiple=1)
        inputs.append(({"input_ids": ids.flip(1), "attention_mask": mask.flip(1)},
                       shapes.randint(16, 48)))

    def run(model, inputs):
        model.eval()
        answers = []
        with torch.inference_mode():
            for prompts, new_tokens in inputs:
                prompts = to_device(prompts)
                answers.append(model.generate(**prompts, max_new_tokens=new_tokens,
                                              min_new_tokens=new_tokens, do_sample=False,
                                              pad_token_id=0).tolist())
    return inputs, run


@workload("gpt2-generate", "decoder generation",
          "transformers GPT2LMHeadModel from a config (as gpt2-train), greedy generation: "
          "6 requests of 1-16 prompts of 8-128 tokens, 16-48 new tokens each")
def gpt2_generate(shapes, data):
    from transformers import GPT2LMHeadModel
    config = gpt2_config()
    return (GPT2LMHeadModel(config), *generation(6, config.vocab_size, shapes, data))


@workload("llama-generate", "decoder generation",
          "transformers LlamaForCausalLM from a config (as llama-train), greedy generation: "
          "6 requests of 1-16 prompts of 8-128 tokens, 16-48 new tokens each")
def llama_generate(shapes, data):
    from transformers import LlamaForCausalLM
    config = llama_config()
    return (LlamaForCausalLM(config), *generation(6, config.vocab_size, shapes, data))


# -- RNNs ---------------------------------------------------------------------------------------

class LSTMLanguageModel(nn.Module):
    """The medium LSTM language model of Zaremba et al. (2 layers of 650,
    dropout 0.5), its decoder tied to the embedding."""

    def __init__(self, vocab=10000, width=650, layers=2):
        super().__init__()
        self.embedding = nn.Embedding(vocab, width)
        self.lstm = nn.LSTM(width, width, layers, dropout=0.5)
        self.decoder = nn.Linear(width, vocab)
        self.decoder.weight = self.embedding.weight

    def forward(self, ids, state):
        out, state = self.lstm(F.dropout(self.embedding(ids), 0.5, self.training), state)
        return self.decoder(F.dropout(out, 0.5, self.training)), state


@workload("lstm-lm-train", "RNN",
          "an LSTM language model (torch.nn: 2 layers of 650, tied 10,000-token embedding), "
          "truncated backpropagation through time of variable length (AWD-LSTM's: about 70 "
          "tokens, 35 one time in 20, spread 5), batches of 20, state carried, SGD, gradient "
          "clipping, 20 steps")
def lstm_lm_train(shapes, data):
    inputs = []
    for _ in range(20):
        length = max(5, int(shapes.gauss(70 if shapes.random() < 0.95 else 35, 5)))
        tokens = torch.randint(0, 10000, (length + 1, 20), generator=data)
        inputs.append((tokens[:-1].clone(), tokens[1:].clone()))

    def run(model, inputs):
        model.train()
        opt = sgd(model)
        state = None
        for ids, targets in inputs:
            ids, targets = to_device(ids), to_device(targets)
            logits, state = model(ids, state)
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 0.25, foreach=True)
            opt.step()
            state = tuple(s.detach() for s in state)
    return LSTMLanguageModel(), inputs, run


class Seq2Seq(nn.Module):
    """An RNN translation model with attention (Bahdanau et al.): a
    bidirectional GRU encoder over packed source sentences, a GRU cell
    decoder run step by step with teacher forcing."""

    def __init__(self, vocab=8000, width=256):
        super().__init__()
        self.source, self.target = nn.Embedding(vocab, width), nn.Embedding(vocab, width)
        self.encoder = nn.GRU(width, width, batch_first=True, bidirectional=True)
        self.keys = nn.Linear(2 * width, 2 * width)
        self.start = nn.Linear(2 * width, 2 * width)
        self.decoder = nn.GRUCell(3 * width, 2 * width)
        self.out = nn.Linear(4 * width, vocab)

    def forward(self, source, lengths, target):
        packed = pack_padded_sequence(self.source(source), lengths, batch_first=True,
                                      enforce_sorted=False)
        memory, last = self.encoder(packed)
        memory = pad_packed_sequence(memory, batch_first=True)[0]
        keys = self.keys(memory)
        padding = torch.arange(memory.shape[1]) >= lengths.unsqueeze(1)
        h = torch.tanh(self.start(torch.cat([last[0], last[1]], 1)))
        logits = []
        for word in self.target(target[:, :-1]).unbind(1):
            scores = torch.bmm(keys, h.unsqueeze(2)).squeeze(2).masked_fill(padding, -1e9)
            context = torch.bmm(scores.softmax(1).unsqueeze(1), memory).squeeze(1)
            h = self.decoder(torch.cat([word, context], 1), h)
            logits.append(self.out(torch.cat([h, context], 1)))
        return torch.stack(logits, 1)


@workload("gru-seq2seq-train", "RNN",
          "an RNN translation model with attention (torch.nn: bidirectional GRU encoder over "
          "packed sentences, GRU cell decoder, width 256, 8,000 tokens), batches of 32 pairs: "
          "sources of 5-60 tokens, targets of 5-50, teacher forcing, Adam, 10 steps")
def gru_seq2seq_train(shapes, data):
    inputs = []
    for _ in range(10):
        source_lengths = torch.tensor([shapes.randint(5, 60) for _ in range(32)])
        target = torch.randint(1, 8000, (32, shapes.randint(5, 50) + 1), generator=data)
        source = torch.randint(1, 8000, (32, int(source_lengths.max())), generator=data)
        inputs.append((source, source_lengths, target))

    def run(model, inputs):
        model.train()
        opt = adam(model)
        for source, lengths, target in inputs:
            source, target = to_device(source), to_device(target)
            logits = model(source, lengths, target)     # (lengths stay on the host)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target[:, 1:].reshape(-1))
            train_step(opt, loss)
    return Seq2Seq(), inputs, run
