import DrivebusConfiguration
import DrivebusKit

await ServiceRunner.main(.bus, configuration: DrivebusConfig.self) { context, config in
    ServiceParts(services: [try Broker(settings: config.process, logger: context.logger)])
}
