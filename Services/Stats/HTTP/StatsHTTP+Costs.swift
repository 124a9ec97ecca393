import Foundation
import Hummingbird
import NIOCore
import StatsCore
import StatsStore

/// Issue 9: costs, the expenses ledger, route ranking and the dashboard.
func addCostsRankingAndDashboard(to router: Router<BasicRequestContext>, store: StatsStore, configuration: StatsHTTPConfiguration) {
    let ranking = RouteRanking(ascentHysteresisM: configuration.ascentHysteresisM)
    let limit = max(1024, configuration.maxBodyBytes)

    router.get("/") { request, context in
        await respond(context) {
            let parameters = StatsParameters(query: request.uri.query ?? "")
            let device = try StatsQuery.parse(StatsParameters(parameters.pairs.filter { $0.name == "device" })).device
            let known = await configuration.knownDevices?() ?? []
            let html = try await store.dashboardHTML(DashboardOptions(
                device: device, costs: configuration.costs, knownDevices: known, phoneSetup: configuration.deviceSetup != nil))
            return Response(
                status: .ok, headers: [.contentType: "text/html; charset=utf-8", .cacheControl: "no-store"],
                body: .init(byteBuffer: ByteBuffer(bytes: html)))
        }
    }
    router.get("/api/v1/costs") { request, context in
        await respond(context) { json(try await store.costsJSON(try query(request), configuration: configuration.costs)) }
    }
    router.get("/api/v1/costs/expenses") { request, context in
        await respond(context) { json(try await store.expensesJSON(try query(request), configuration: configuration.costs)) }
    }
    router.post("/api/v1/costs/expenses") { request, context in
        await respond(context) {
            let body = try await collect(request, limit: limit)
            return json(try await store.addExpensesJSON(body: body, contentType: request.headers[.contentType]))
        }
    }
    router.post("/api/v1/routes/rank") { request, context in
        await respond(context) {
            let parameters = StatsParameters(query: request.uri.query ?? "")
            let format = try parameters.single("format") ?? "json"
            guard format == "json" || format == "svg" else { throw StatsError.invalid("format", "must be json or svg") }
            let width = try parameters.integer("width", default: 960, in: 300...10_000)
            let height = try parameters.integer("height", default: 480, in: 200...10_000)
            let routes = try RouteRanking.read(try await collect(request, limit: limit))
            let ranked = try ranking.rank(routes)
            if format == "svg" {
                return Response(
                    status: .ok, headers: [.contentType: "image/svg+xml"],
                    body: .init(byteBuffer: ByteBuffer(bytes: ranking.svg(ranked, width: width, height: height))))
            }
            return json(ranking.json(ranked))
        }
    }
}

/// The request body, or 413 `stats.too_large` beyond `limit` bytes.
private func collect(_ request: Request, limit: Int) async throws -> [UInt8] {
    do {
        var buffer = try await request.body.collect(upTo: limit)
        return buffer.readBytes(length: buffer.readableBytes) ?? []
    } catch is NIOTooManyBytesError {
        throw StatsError(status: 413, code: "stats.too_large", message: "body: larger than \(limit) bytes", field: "body")
    }
}
