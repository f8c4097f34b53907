"""A self-written equivalent of PyTorch's ImageNet example (pytorch/examples imagenet/main.py):
ImageFolder train/val loaders with the standard transforms, pin_memory, a small CNN, SGD.
Plain PyTorch; it knows nothing of dali_autoproxy. Prints one JSON line at the end."""
import argparse
import json
import os
import sys

import torch
import torch.nn as nn
import torchvision.datasets as datasets
import torchvision.transforms as transforms


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("-b", "--batch-size", type=int, default=8)
    parser.add_argument("-j", "--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    train_dataset = datasets.ImageFolder(os.path.join(args.data, "train"), transforms.Compose([
        transforms.RandomResizedCrop(64), transforms.RandomHorizontalFlip(), transforms.ToTensor(), normalize]))
    val_dataset = datasets.ImageFolder(os.path.join(args.data, "val"), transforms.Compose([
        transforms.Resize(72), transforms.CenterCrop(64), transforms.ToTensor(), normalize]))
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, shuffle=True,
                                               num_workers=args.workers, pin_memory=True)
    val_loader = torch.utils.data.DataLoader(val_dataset, batch_size=args.batch_size, shuffle=False,
                                             num_workers=args.workers, pin_memory=True)
    model = nn.Sequential(nn.Conv2d(3, 8, 5, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, len(train_dataset.classes))).to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9)
    for epoch in range(args.epochs):
        model.train()
        train_loss = 0.0
        for images, target in train_loader:
            images = images.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            loss = criterion(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            train_loss += loss.item() * len(target)
        model.eval()
        correct, val_loss = 0, 0.0
        with torch.no_grad():
            for images, target in val_loader:
                images, target = images.to(device, non_blocking=True), target.to(device, non_blocking=True)
                output = model(images)
                val_loss += criterion(output, target).item() * len(target)
                correct += (output.argmax(1) == target).sum().item()
    report = None
    if "dali_autoproxy" in sys.modules and sys.modules["dali_autoproxy"].report():
        report = [(r["proxied"], r["reason"]) for r in sys.modules["dali_autoproxy"].report()]
    print(json.dumps({"train_loss": train_loss / len(train_dataset), "val_loss": val_loss / len(val_dataset),
                      "val_acc": correct / len(val_dataset), "report": report, "device": str(device)}))


if __name__ == "__main__":
    main()
