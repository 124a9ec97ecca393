import DrivebusKit

await ServiceRunner.main(.bus) { context in
    ServiceParts(services: [try Broker(config: context.config, logger: context.logger)])
}
