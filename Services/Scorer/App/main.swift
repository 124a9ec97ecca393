import DrivebusKit

await ServiceRunner.main(.scorer)
