"""Held-out script 1: ResNet-18 trained on the CPU, JPEGs through ImageFolder, worker processes.

No pipeprof in it (the images are made with pipeprof.demo.make_images: nothing to download).
"""

import argparse
import os
import tempfile

import torch
import torchvision
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

from pipeprof.demo import make_images

p = argparse.ArgumentParser()
p.add_argument("--workers", type=int, default=2)
p.add_argument("--steps", type=int, default=24)
p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "pipeprof-heldout-jpeg"))
args = p.parse_args()
if not os.path.isdir(args.data):
    make_images(args.data, count=512, size=(160, 160))
chain = transforms.Compose([
    transforms.RandomResizedCrop(96), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
    transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
])  # fmt: skip
train = DataLoader(datasets.ImageFolder(args.data, transform=chain), batch_size=32,
                   shuffle=True, num_workers=args.workers)  # fmt: skip
model = torchvision.models.resnet18(num_classes=4)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
step = 0
while step < args.steps:
    for images, labels in train:
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step >= args.steps:
            break
print("steps", step)
