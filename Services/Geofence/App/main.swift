import DrivebusKit

await ServiceRunner.main(.geofence)
