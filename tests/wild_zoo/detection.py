"""torchvision's Faster R-CNN (MobileNetV3 backbone, random weights, nothing downloaded): two
training steps with box targets (the first step's loss is the result), then inference (its NMS and RoI align custom ops)."""
import torch
import torchvision

torch.manual_seed(0)
model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
    weights=None, weights_backbone=None, num_classes=4).cuda()
images = [torch.rand(3, 160, 200, device="cuda"), torch.rand(3, 180, 160, device="cuda")]
targets = [{"boxes": torch.tensor([[10.0, 20.0, 80.0, 90.0], [30.0, 30.0, 120.0, 150.0]], device="cuda"),
            "labels": torch.tensor([1, 2], device="cuda")},
           {"boxes": torch.tensor([[5.0, 5.0, 60.0, 70.0]], device="cuda"),
            "labels": torch.tensor([3], device="cuda")}]
opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
model.train()
first = None
for _ in range(2):
    losses = model(images, targets)
    loss = sum(losses.values())
    first = loss.item() if first is None else first
    opt.zero_grad()
    loss.backward()
    opt.step()
model.eval()
with torch.no_grad():
    dets = model(images)
# (the first loss only: RoI align's backward sums with atomics, in any order, so the later
# steps differ in their last digits from run to run)
print("ZOO result", f"{first:.6g}", len(dets))
