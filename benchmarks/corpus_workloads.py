"""The corpus's workloads: real model code, with the shapes varying as real
workloads vary them, small enough to record on a 2-core CPU in minutes.

Each workload is a function ``build(shapes, data)`` registered with
:func:`workload`: ``shapes`` is a ``random.Random`` choosing the shapes,
``data`` a ``torch.Generator`` for the tensors. It returns ``(model,
inputs, run)``: the model and every step's input, made before the
recording (a data loader makes them on the host), and ``run(model,
inputs)``, what the recording sees once the model's parameters and buffers
have been copied to fresh storage (as ``model.to("cuda")`` does): each
input copied to the device (:func:`to_device`, as ``.to("cuda")``), the
optimizer (foreach, as PyTorch picks on a GPU), the steps. Training loops
are written as a training script is, variables rebound each step, not
deleted.

Workloads come in pairs of one family (this module: vision;
corpus_text.py: language models and RNNs; corpus_diffusion_graph.py);
the first of a pair is in the tuning half of the corpus, the second in the
held-out half (the rule of the split, fixed before any trace was recorded:
benchmarks/traces/README.md).
"""

from typing import Callable, NamedTuple

import torch
import torchvision
from torch import nn
from torch.nn import functional as F


class Workload(NamedTuple):
    name: str
    family: str
    what: str
    build: Callable


WORKLOADS = {}      # name -> Workload, the two of a family one after the other


def workload(name, family, what):
    """Register ``build`` as the workload ``name`` of ``family``."""
    def register(build):
        WORKLOADS[name] = Workload(name, family, what, build)
        return build
    return register


def half(name):
    """"tuning" or "held-out": the first workload of its family's pair is
    tuning, the second held-out."""
    family = [w.name for w in WORKLOADS.values() if w.family == WORKLOADS[name].family]
    return "tuning" if family.index(name) == 0 else "held-out"


def to_device(value):
    """``value`` (a tensor, or a list, tuple or dict of them) copied to
    fresh storage, as ``.to("cuda")`` copies a host batch to a GPU."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {key: to_device(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_device(v) for v in value)
    return value


def train_step(optimizer, loss):
    """Backward and an optimizer step, the gradients freed first
    (``zero_grad(set_to_none=True)``)."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4,
                           foreach=True)


def adam(model):
    return torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)


def adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)


def epoch_batches(steps, batch, last):
    """Batch sizes of ``steps`` steps over epochs of 5 batches of
    ``batch`` and a last one of ``last``."""
    return [last if i % 6 == 5 else batch for i in range(steps)]


def labelled_images(data, batch, height, width, classes=1000):
    return (torch.randn(batch, 3, height, width, generator=data),
            torch.randint(0, classes, (batch,), generator=data))


def resized_batches(data, steps, batch, last, first, grow, every):
    """(images, labels) of ``steps`` epoch_batches(steps, batch, last),
    square images of ``first`` px growing by ``grow`` every ``every`` steps
    (progressive resizing)."""
    return [labelled_images(data, n, first + grow * (step // every), first + grow * (step // every))
            for step, n in enumerate(epoch_batches(steps, batch, last))]


def multiscale_batches(shapes, data, steps, batch, last, sizes):
    """(images, labels) of ``steps`` epoch_batches(steps, batch, last),
    each batch's square size drawn from ``sizes`` (multi-scale training)."""
    drawn = [shapes.choice(sizes) for _ in range(steps)]
    return [labelled_images(data, n, size, size)
            for n, size in zip(epoch_batches(steps, batch, last), drawn)]


def classification_training(optimizer):
    """``run``: train with ``optimizer(model)`` on (images, labels) inputs."""
    def run(model, inputs):
        opt = optimizer(model)
        for images, labels in inputs:
            images, labels = to_device(images), to_device(labels)
            loss = F.cross_entropy(model(images), labels)
            train_step(opt, loss)
    return run


# -- vision classification ---------------------------------------------------------------

@workload("resnet50-train", "vision classification",
          "torchvision ResNet-50 (1000 classes) training, SGD with momentum, batches of 16 "
          "(each 6th of 9, an epoch's end), progressive resizing 96 to 144 px, 12 steps")
def resnet50_train(shapes, data):
    inputs = resized_batches(data, 12, 16, 9, 96, 16, 3)
    return torchvision.models.resnet50(), inputs, classification_training(sgd)


@workload("convnext-train", "vision classification",
          "torchvision ConvNeXt-Tiny (1000 classes) training, AdamW, batches of 12 (each 6th "
          "of 5), multi-scale: each batch's size drawn from 96-176 px, 12 steps")
def convnext_train(shapes, data):
    inputs = multiscale_batches(shapes, data, 12, 12, 5, (96, 112, 128, 144, 160, 176))
    return torchvision.models.convnext_tiny(), inputs, classification_training(adamw)


# -- vision inference with varying batch ------------------------------------------------

def serving(requests, sizes, shapes, data):
    """(inputs, run): ``requests`` requests of 1-64 images each, of a size
    drawn from ``sizes``, answered in inference mode."""
    inputs = []
    for _ in range(requests):
        size = shapes.choice(sizes)
        inputs.append(torch.randn(shapes.randint(1, 64), 3, size, size, generator=data))

    def run(model, inputs):
        model.eval()
        answers = []
        with torch.inference_mode():
            for images in inputs:
                images = to_device(images)
                answers.append(model(images).softmax(-1).topk(5).indices.tolist())
    return inputs, run


@workload("resnet50-serve", "vision inference",
          "torchvision ResNet-50 inference, batches of 1-64 images (uniform) of 160 px, "
          "30 requests")
def resnet50_serve(shapes, data):
    return (torchvision.models.resnet50(), *serving(30, (160,), shapes, data))


@workload("efficientnet-serve", "vision inference",
          "torchvision EfficientNet-B0 inference, batches of 1-64 images (uniform) of 160, "
          "192 or 224 px, 30 requests")
def efficientnet_serve(shapes, data):
    return (torchvision.models.efficientnet_b0(), *serving(30, (160, 192, 224), shapes, data))


# -- detection ----------------------------------------------------------------------------

def detection_batches(steps, shapes, data, classes=21):
    """Batches of 2 images of 256-512 x 256-512 px (multiples of 32), each
    with 1 to 8 random boxes and labels."""
    batches = []
    for _ in range(steps):
        images, targets = [], []
        for _ in range(2):
            h, w, n = shapes.randrange(256, 513, 32), shapes.randrange(256, 513, 32), \
                shapes.randint(1, 8)
            corners = torch.rand(n, 2, generator=data) * torch.tensor([w * 0.7, h * 0.7])
            extent = torch.rand(n, 2, generator=data) * torch.tensor([w * 0.3, h * 0.3]) + 8
            images.append(torch.rand(3, h, w, generator=data))
            targets.append({"boxes": torch.cat([corners, corners + extent], 1),
                            "labels": torch.randint(1, classes, (n,), generator=data)})
        batches.append((images, targets))
    return batches


def detection_training(model, inputs):
    model.train()
    opt = sgd(model)
    for images, targets in inputs:
        images, targets = to_device(images), to_device(targets)
        losses = model(images, targets)
        train_step(opt, sum(losses.values()))


def detector(build, shapes, data):
    """A torchvision detector made by ``build`` (random weights, 21
    classes, resized to a short side drawn from 256-384 px, the long one
    at most 512), trained 8 steps on detection_batches."""
    model = build(weights=None, weights_backbone=None, num_classes=21,
                  min_size=(256, 288, 320, 352, 384), max_size=512)
    return model, detection_batches(8, shapes, data), detection_training


@workload("fasterrcnn-train", "detection",
          "torchvision Faster R-CNN, ResNet-50 FPN, 21 classes, training, SGD with momentum, "
          "2 images a batch of 256-512 px each side, resized to a short side drawn from "
          "256-384 (multi-scale), 1-8 boxes each, 8 steps")
def fasterrcnn_train(shapes, data):
    return detector(torchvision.models.detection.fasterrcnn_resnet50_fpn, shapes, data)


@workload("retinanet-train", "detection",
          "torchvision RetinaNet, ResNet-50 FPN, 21 classes, training, SGD with momentum, "
          "2 images a batch of 256-512 px each side, resized to a short side drawn from "
          "256-384 (multi-scale), 1-8 boxes each, 8 steps")
def retinanet_train(shapes, data):
    return detector(torchvision.models.detection.retinanet_resnet50_fpn, shapes, data)


# -- segmentation -------------------------------------------------------------------------

def segmentation_batches(steps, batch, classes, shapes, data):
    """Batches of crops whose height and width are drawn per step
    (multiples of 32, 160-352 px), with their masks."""
    batches = []
    for _ in range(steps):
        h, w = shapes.randrange(160, 353, 32), shapes.randrange(160, 353, 32)
        batches.append((torch.randn(batch, 3, h, w, generator=data),
                        torch.randint(0, classes, (batch, h, w), generator=data)))
    return batches


def segmentation_training(optimizer):
    def run(model, inputs):
        model.train()
        opt = optimizer(model)
        for images, masks in inputs:
            images, masks = to_device(images), to_device(masks)
            out = model(images)
            if isinstance(out, dict):       # torchvision's: "out" and the auxiliary "aux"
                loss = F.cross_entropy(out["out"], masks) + 0.4 * F.cross_entropy(out["aux"], masks)
            else:
                loss = F.cross_entropy(out, masks)
            train_step(opt, loss)
    return run


@workload("deeplabv3-train", "segmentation",
          "torchvision DeepLabV3, ResNet-50 (output stride 8), auxiliary head, 21 classes, "
          "training, SGD with momentum, batches of 2 crops of 160-352 x 160-352 px drawn "
          "per step, 8 steps")
def deeplabv3_train(shapes, data):
    model = torchvision.models.segmentation.deeplabv3_resnet50(
        weights=None, weights_backbone=None, num_classes=21, aux_loss=True)
    return model, segmentation_batches(8, 2, 21, shapes, data), segmentation_training(sgd)


class UNet(nn.Module):
    """The U-Net of Ronneberger et al. (padded convolutions, batch norm):
    ``depth`` downsamplings, ``width`` channels at the top."""

    def __init__(self, classes, width=32, depth=4):
        super().__init__()
        widths = [width << i for i in range(depth + 1)]
        self.down = nn.ModuleList(self.double(a, b) for a, b in zip([3] + widths, widths))
        self.up = nn.ModuleList(nn.ConvTranspose2d(b, a, 2, 2) for a, b in zip(widths, widths[1:]))
        self.merge = nn.ModuleList(self.double(2 * a, a) for a in widths[:-1])
        self.head = nn.Conv2d(width, classes, 1)

    @staticmethod
    def double(a, b):
        return nn.Sequential(nn.Conv2d(a, b, 3, padding=1, bias=False), nn.BatchNorm2d(b),
                             nn.ReLU(inplace=True), nn.Conv2d(b, b, 3, padding=1, bias=False),
                             nn.BatchNorm2d(b), nn.ReLU(inplace=True))

    def forward(self, x):
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else F.max_pool2d(x, 2))
            skips.append(x)
        skips.pop()
        for up, merge in zip(reversed(self.up), reversed(self.merge)):
            x = merge(torch.cat([skips.pop(), up(x)], 1))
        return self.head(x)


@workload("unet-train", "segmentation",
          "a U-Net (torch.nn: 4 levels, 32-512 channels, batch norm), 6 classes, training, "
          "Adam, batches of 4 crops of 160-352 x 160-352 px drawn per step, 10 steps")
def unet_train(shapes, data):
    return UNet(6), segmentation_batches(10, 4, 6, shapes, data), segmentation_training(adam)


# -- vision transformers and mixers ---------------------------------------------------------

def varying_batches(steps, size, low, high, shapes, data):
    """(images, labels) of ``size`` px, ``low``-``high`` a batch, drawn per step."""
    return [labelled_images(data, shapes.randint(low, high), size, size) for _ in range(steps)]


@workload("vit-train", "vision transformer",
          "torchvision VisionTransformer (128 px, patches of 16, 8 layers of width 512, 8 "
          "heads), training, AdamW, batch size drawn per step from 8-48, 12 steps")
def vit_train(shapes, data):
    model = torchvision.models.VisionTransformer(image_size=128, patch_size=16, num_layers=8,
                                                 num_heads=8, hidden_dim=512, mlp_dim=2048)
    return model, varying_batches(12, 128, 8, 48, shapes, data), classification_training(adamw)


@workload("mixer-train", "vision transformer",
          "timm MLP-Mixer S/16 at 128 px (random weights), training, AdamW, batch size "
          "drawn per step from 8-48, 12 steps")
def mixer_train(shapes, data):
    import timm
    model = timm.create_model("mixer_s16_224", pretrained=False, img_size=128)
    return model, varying_batches(12, 128, 8, 48, shapes, data), classification_training(adamw)
