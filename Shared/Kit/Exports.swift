// Services import DrivebusKit alone and get the bus types with it.
@_exported import DrivebusSchema
@_exported import DrivebusZMQ
@_exported import DrivebusGeo
@_exported import DrivebusSettings
