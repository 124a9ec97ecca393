import DrivebusKit

await ServiceRunner.main(.checkout)
