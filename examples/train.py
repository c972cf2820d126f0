"""A plain PyTorch training script, with no pipeprof in it: profile it unmodified with

    pipeprof run examples/train.py --epochs 1

It trains a small CNN on JPEG images decoded and augmented by torchvision in a DataLoader with
worker processes, and checks accuracy on a validation loader every ``--val-every`` steps. The
images are made up on the spot (pipeprof.demo.make_images) so that there is nothing to download;
a real script would read its own folder.
"""

import argparse
import tempfile

import torch
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

from pipeprof.demo import make_images, tiny_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--images", type=int, default=256)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--val-every", type=int, default=0, help="validate every N steps (0: per epoch)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()

    augment = transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.ColorJitter(0.3, 0.3, 0.3),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])  # fmt: skip
    plain = transforms.Compose([
        transforms.Resize(256),
        transforms.CenterCrop(224),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        make_images(f"{tmp}/train", count=args.images)
        make_images(f"{tmp}/val", count=max(32, args.images // 8), seed=1)
        train_loader = DataLoader(
            datasets.ImageFolder(f"{tmp}/train", transform=augment),
            batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
        )  # fmt: skip
        val_loader = DataLoader(
            datasets.ImageFolder(f"{tmp}/val", transform=plain),
            batch_size=args.batch_size, num_workers=min(args.workers, 1),
        )  # fmt: skip
        model = tiny_model().to(args.device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()
        step = 0
        for epoch in range(args.epochs):
            for images, labels in train_loader:
                images, labels = images.to(args.device), labels.to(args.device)
                loss = loss_fn(model(images), labels)
                opt.zero_grad()
                loss.backward()
                opt.step()
                step += 1
                if args.val_every and step % args.val_every == 0:
                    accuracy = evaluate(model, val_loader, args.device)
                    print(f"step {step}: loss {loss.item():.3f}, val accuracy {accuracy:.2f}")
            accuracy = evaluate(model, val_loader, args.device)
            print(f"epoch {epoch}: {step} steps, loss {loss.item():.3f}, val {accuracy:.2f}")


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, device: str) -> float:
    right = total = 0
    for images, labels in loader:
        right += (model(images.to(device)).argmax(1) == labels.to(device)).sum().item()
        total += len(labels)
    return right / total


if __name__ == "__main__":
    main()
