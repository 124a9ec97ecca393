import DrivebusKit

await ServiceRunner.main(.stats)
