import DrivebusKit

await ServiceRunner.main(.ingest)
