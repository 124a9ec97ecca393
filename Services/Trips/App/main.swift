import DrivebusKit

await ServiceRunner.main(.trips)
