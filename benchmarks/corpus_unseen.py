"""Workloads the corpus has never seen (issue 40's generalisation check):
model families and configurations not among corpus_workloads.WORKLOADS,
written as those are (built from configurations with random weights,
nothing downloaded; inputs made before the recording, each step copying
its batch with to_device; foreach optimizers). Registered in their own
registry, UNSEEN, so that the corpus and its split stay as they are;
recorded by ``benchmarks/record_corpus.py --unseen``.
"""

import torch
import torchvision
from torch import nn
from torch.nn import functional as F

from corpus_workloads import (Workload, adamw, classification_training, epoch_batches,
                              labelled_images, multiscale_batches, resized_batches, to_device,
                              train_step)

UNSEEN = {}     # name -> Workload


def unseen(name, family, what):
    def register(build):
        UNSEEN[name] = Workload(name, family, what, build)
        return build
    return register


def rmsprop(model):
    """MobileNet's optimizer (TensorFlow-style RMSprop with momentum)."""
    return torch.optim.RMSprop(model.parameters(), lr=0.016, alpha=0.9, eps=0.0316,
                               momentum=0.9, weight_decay=1e-5, foreach=True)


def nesterov(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True,
                           weight_decay=1e-4, foreach=True)


# -- vision classification: mobile and densely connected networks -------------------------

@unseen("mobilenetv3-train", "vision classification (mobile)",
        "torchvision MobileNetV3-Large (1000 classes) training, RMSprop with momentum, "
        "batches of 32 (each 6th of 13, an epoch's end), multi-scale: each batch's size "
        "drawn from 128-224 px, 12 steps")
def mobilenetv3_train(shapes, data):
    inputs = multiscale_batches(shapes, data, 12, 32, 13, (128, 160, 192, 224))
    return torchvision.models.mobilenet_v3_large(), inputs, classification_training(rmsprop)


@unseen("densenet121-train", "vision classification (dense connectivity)",
        "torchvision DenseNet-121 (1000 classes, memory-efficient off) training, SGD with "
        "Nesterov momentum, batches of 16 (each 6th of 7), progressive resizing 96 to 160 px, "
        "12 steps")
def densenet121_train(shapes, data):
    inputs = resized_batches(data, 12, 16, 7, 96, 32, 4)
    return torchvision.models.densenet121(), inputs, classification_training(nesterov)


# -- hierarchical vision transformer -----------------------------------------------------------

@unseen("swin-train", "vision transformer (windowed)",
        "timm Swin-T (patches of 4, windows of 7, 1000 classes, random weights) at 224 px, "
        "training with label smoothing, AdamW, gradient clipping, batch size drawn per step "
        "from 4-24, 10 steps")
def swin_train(shapes, data):
    import timm
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False)
    inputs = [labelled_images(data, shapes.randint(4, 24), 224, 224) for _ in range(10)]

    def run(model, inputs):
        model.train()
        opt = adamw(model)
        for images, labels in inputs:
            images, labels = to_device(images), to_device(labels)
            loss = F.cross_entropy(model(images), labels, label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 5.0, foreach=True)
            opt.step()
    return model, inputs, run


# -- speech: CTC on raw audio of varying length -----------------------------------------------

@unseen("wav2vec2-ctc-train", "speech recognition",
        "transformers Wav2Vec2ForCTC from a config (7-layer convolutional feature encoder, "
        "6 transformer layers of width 384, 6 heads, 32 characters), CTC fine-tuning, AdamW, "
        "batches of 4-8 utterances of 1-6 s of 16 kHz audio drawn each, padded to the "
        "batch's longest, transcripts of 10-16 characters a second, 10 steps")
def wav2vec2_ctc_train(shapes, data):
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC
    config = Wav2Vec2Config(hidden_size=384, num_hidden_layers=6, num_attention_heads=6,
                            intermediate_size=1536, vocab_size=32, pad_token_id=0,
                            ctc_loss_reduction="mean", mask_time_prob=0.05,
                            do_stable_layer_norm=True, feat_extract_norm="layer")
    inputs = []
    for _ in range(10):
        seconds = [shapes.uniform(1.0, 6.0) for _ in range(shapes.randint(4, 8))]
        samples = [int(s * 16000) for s in seconds]
        audio = torch.randn(len(samples), max(samples), generator=data)
        mask = torch.zeros(len(samples), max(samples), dtype=torch.long)
        chars = [int(s * shapes.randint(10, 16)) for s in seconds]
        labels = torch.full((len(samples), max(chars)), -100, dtype=torch.long)
        for row, (n, c) in enumerate(zip(samples, chars)):
            mask[row, :n] = 1
            audio[row, n:] = 0
            labels[row, :c] = torch.randint(1, 32, (c,), generator=data)
        inputs.append({"input_values": audio, "attention_mask": mask, "labels": labels})

    def run(model, inputs):
        model.train()
        opt = adamw(model)
        for batch in inputs:
            batch = to_device(batch)
            train_step(opt, model(**batch).loss)
    return Wav2Vec2ForCTC(config), inputs, run


# -- encoder-decoder: denoising / summarisation ---------------------------------------------

@unseen("bart-train", "encoder-decoder language model",
        "transformers BartForConditionalGeneration from a config (6 + 6 layers of width "
        "512, 8 heads, learned positions, 50,265 tokens, tied embeddings), summarisation-style "
        "training, AdamW, batches of 6 pairs: articles of 64-512 tokens, summaries of 16-96, "
        "padded to each batch's longest, 10 steps")
def bart_train(shapes, data):
    from transformers import BartConfig, BartForConditionalGeneration
    from corpus_text import lm_training, pair_batches
    config = BartConfig(d_model=512, encoder_layers=6, decoder_layers=6,
                        encoder_attention_heads=8, decoder_attention_heads=8,
                        encoder_ffn_dim=2048, decoder_ffn_dim=2048, max_position_embeddings=1024)
    inputs = pair_batches(shapes, data, 10, 6, (64, 96, 512), (16, 24, 96), config.vocab_size)
    return BartForConditionalGeneration(config), inputs, lm_training


# -- text classification serving ---------------------------------------------------------------

@unseen("roberta-serve", "text inference",
        "transformers RobertaForSequenceClassification from a config (8 layers of width 512, "
        "8 heads, 50,265 tokens, 3 labels), inference: 30 requests of 1-64 sentences of "
        "8-256 tokens (padded to the request's longest)")
def roberta_serve(shapes, data):
    from transformers import RobertaConfig, RobertaForSequenceClassification
    from corpus_text import padded_batch
    config = RobertaConfig(hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                           intermediate_size=2048, num_labels=3, max_position_embeddings=514)
    inputs = []
    for _ in range(30):
        top = shapes.randint(16, 256)
        ids, mask = padded_batch(data, [shapes.randint(8, top)
                                        for _ in range(shapes.randint(1, 64))],
                                 config.vocab_size - 2)
        # tokens 3 and up; padding is RoBERTa's token 1
        inputs.append({"input_ids": torch.where(mask == 1, ids + 2, config.pad_token_id),
                       "attention_mask": mask})

    def run(model, inputs):
        model.eval()
        answers = []
        with torch.inference_mode():
            for batch in inputs:
                batch = to_device(batch)
                answers.append(model(**batch).logits.softmax(-1).argmax(-1).tolist())
    return RobertaForSequenceClassification(config), inputs, run


# -- generative adversarial network ------------------------------------------------------------

class Generator(nn.Module):
    """DCGAN's generator (Radford et al.), 128 x 128 px output."""

    def __init__(self, latent=128, width=64):
        super().__init__()
        layers, channels = [], [width * 16, width * 8, width * 4, width * 2, width]
        layers += [nn.ConvTranspose2d(latent, channels[0], 4, 1, 0, bias=False),
                   nn.BatchNorm2d(channels[0]), nn.ReLU(True)]
        for a, b in zip(channels, channels[1:]):
            layers += [nn.ConvTranspose2d(a, b, 4, 2, 1, bias=False), nn.BatchNorm2d(b),
                       nn.ReLU(True)]
        layers += [nn.ConvTranspose2d(width, 3, 4, 2, 1, bias=False), nn.Tanh()]
        self.net = nn.Sequential(*layers)

    def forward(self, z):
        return self.net(z)


class Discriminator(nn.Module):
    """DCGAN's discriminator, 128 x 128 px input."""

    def __init__(self, width=64):
        super().__init__()
        channels = [width, width * 2, width * 4, width * 8, width * 16]
        layers = [nn.Conv2d(3, width, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, True)]
        for a, b in zip(channels, channels[1:]):
            layers += [nn.Conv2d(a, b, 4, 2, 1, bias=False), nn.BatchNorm2d(b),
                       nn.LeakyReLU(0.2, True)]
        layers += [nn.Conv2d(channels[-1], 1, 4, 1, 0, bias=False)]
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x).flatten()


class GAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.generator, self.discriminator = Generator(), Discriminator()


@unseen("dcgan-train", "generative adversarial network",
        "a DCGAN (torch.nn: generator and discriminator of 64-1024 channels, batch norm) at "
        "128 x 128 px, alternating discriminator and generator steps with two Adam "
        "optimizers, batches of 32 (each 6th of 20, an epoch's end), 12 steps")
def dcgan_train(shapes, data):
    inputs = [(torch.rand(batch, 3, 128, 128, generator=data) * 2 - 1,
               torch.randn(batch, 128, 1, 1, generator=data))
              for batch in epoch_batches(12, 32, 20)]

    def run(model, inputs):
        model.train()
        g, d = model.generator, model.discriminator
        opt_g = torch.optim.Adam(g.parameters(), lr=2e-4, betas=(0.5, 0.999), foreach=True)
        opt_d = torch.optim.Adam(d.parameters(), lr=2e-4, betas=(0.5, 0.999), foreach=True)
        for real, z in inputs:
            real, z = to_device(real), to_device(z)
            fake = g(z)
            real_scores, fake_scores = d(real), d(fake.detach())
            loss_d = (F.binary_cross_entropy_with_logits(real_scores, torch.ones_like(real_scores))
                      + F.binary_cross_entropy_with_logits(fake_scores,
                                                           torch.zeros_like(fake_scores)))
            train_step(opt_d, loss_d)
            scores = d(fake)
            loss_g = F.binary_cross_entropy_with_logits(scores, torch.ones_like(scores))
            train_step(opt_g, loss_g)
    return GAN(), inputs, run


# -- instance segmentation ---------------------------------------------------------------------

@unseen("maskrcnn-train", "instance segmentation",
        "torchvision Mask R-CNN, ResNet-50 FPN, 21 classes, training, SGD with momentum, "
        "2 images a batch of 256-512 px each side, resized to a short side drawn from "
        "256-384 (multi-scale), 1-8 boxes with masks each, 6 steps")
def maskrcnn_train(shapes, data):
    from corpus_workloads import detection_batches, detection_training
    batches = detection_batches(6, shapes, data)
    for images, targets in batches:
        for image, target in zip(images, targets):
            h, w = image.shape[1:]
            masks = torch.zeros(len(target["boxes"]), h, w, dtype=torch.uint8)
            for m, (x0, y0, x1, y1) in zip(masks, target["boxes"].round().long().tolist()):
                m[y0:y1, x0:x1] = 1
            target["masks"] = masks
    model = torchvision.models.detection.maskrcnn_resnet50_fpn(
        weights=None, weights_backbone=None, num_classes=21,
        min_size=(256, 288, 320, 352, 384), max_size=512)
    return model, batches, detection_training

