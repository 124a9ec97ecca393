import Foundation
import Hummingbird
import NIOCore
import StatsCore
import StatsStore

/// The interactive map (issue 20): the page, Leaflet from the machine's own install, and the
/// tiles and bounds it reads.
public struct MapPageConfiguration: Sendable {
    /// A base map's tile URL with `{z}`, `{x}`, `{y}`; nil draws on a plain background.
    public var tileURL: String?
    public var attribution: String?
    /// Where `leaflet.js` and `leaflet.css` are (Debian's `libjs-leaflet`).
    public var leafletDirectory: String

    public init(tileURL: String? = nil, attribution: String? = nil, leafletDirectory: String = "/usr/share/javascript/leaflet") {
        self.tileURL = tileURL
        self.attribution = attribution
        self.leafletDirectory = leafletDirectory
    }
}

func addMap(to router: Router<BasicRequestContext>, store: StatsStore, configuration: MapPageConfiguration) {
    let files = StaticFiles(directory: configuration.leafletDirectory)
    let page = MapPage.html(tileURL: configuration.tileURL, attribution: configuration.attribution)

    router.get("/map") { _, _ in
        Response(
            status: .ok, headers: [.contentType: "text/html; charset=utf-8", .cacheControl: "no-store"],
            body: .init(byteBuffer: ByteBuffer(string: page)))
    }
    for (name, type) in [("leaflet.js", "text/javascript; charset=utf-8"), ("leaflet.css", "text/css; charset=utf-8")] {
        router.get(RouterPath("/static/leaflet/\(name)")) { _, context in
            await respond(context) {
                Response(
                    status: .ok, headers: [.contentType: type, .cacheControl: "max-age=86400"],
                    body: .init(byteBuffer: ByteBuffer(bytes: try await files.contents(of: name))))
            }
        }
    }
    router.get("/api/v1/map/bounds") { request, context in
        await respond(context) {
            let filter = try MapFilter.parse(StatsParameters(query: request.uri.query ?? ""))
            var response = json(try await store.mapBoundsJSON(filter))
            response.headers[.cacheControl] = "no-store"
            return response
        }
    }
    router.get("/api/v1/map/tiles/:z/:x/:y") { request, context in
        await respond(context) {
            let filter = try MapFilter.parse(StatsParameters(query: request.uri.query ?? ""))
            func number(_ name: String) throws(StatsError) -> Int {
                var text = context.parameters.get(name) ?? ""
                if name == "y", text.hasSuffix(".bin") { text.removeLast(4) }
                guard let value = Int(text) else { throw StatsError.invalid(name, "must be a whole number, got \"\(text)\"") }
                return value
            }
            let tile = try mapTile(z: try number("z"), x: try number("x"), y: try number("y"))
            return Response(
                status: .ok,
                // The page names the map's data version in the URL (`v`, from /bounds): a tile of a
                // version never changes.
                headers: [.contentType: "application/octet-stream", .cacheControl: request.uri.queryParameters["v"] == nil ? "no-store" : "max-age=3600"],
                body: .init(byteBuffer: ByteBuffer(bytes: try await store.mapTile(tile, filter))))
        }
    }
    router.get("/api/v1/map/pick") { request, context in
        await respond(context) {
            let parameters = StatsParameters(query: request.uri.query ?? "")
            let filter = try MapFilter.parse(parameters)
            func required(_ name: String, in range: ClosedRange<Int>) throws(StatsError) -> Int {
                guard try parameters.single(name) != nil else { throw StatsError.invalid(name, "is required") }
                return try parameters.integer(name, default: 0, in: range)
            }
            let tile = try mapTile(
                z: try required("z", in: 0...MapTiles.maxZoom), x: try required("x", in: 0...Int(Int32.max)),
                y: try required("y", in: 0...Int(Int32.max)))
            // Where in the tile, in its units (0 to `extent` across; the page's 512 pixels).
            let span = -MapTiles.buffer...(MapTiles.extent + MapTiles.buffer)
            let x = try required("unit_x", in: span), y = try required("unit_y", in: span)
            let radius = try parameters.integer("radius", default: 64, in: 0...MapTiles.extent)
            var response = json(try await store.mapPickJSON(tile, x: Double(x), y: Double(y), radius: Double(radius), filter))
            response.headers[.cacheControl] = "no-store"
            return response
        }
    }
}

private func mapTile(z: Int, x: Int, y: Int) throws(StatsError) -> MapTiles.TileID {
    let tile = MapTiles.TileID(z: z, x: x, y: y)
    guard (0...MapTiles.maxZoom).contains(z) else { throw StatsError.invalid("z", "must be 0 to \(MapTiles.maxZoom)") }
    let last = (1 << z) - 1
    guard (0...last).contains(x) else { throw StatsError.invalid("x", "must be 0 to \(last) at zoom \(z)") }
    guard tile.isValid else { throw StatsError.invalid("y", "must be 0 to \(last) at zoom \(z)") }
    return tile
}

/// Files read once, off the cooperative pool, and kept.
private actor StaticFiles {
    let directory: String
    private var loaded: [String: [UInt8]] = [:]

    init(directory: String) { self.directory = directory }

    func contents(of name: String) async throws(StatsError) -> [UInt8] {
        if let bytes = loaded[name] { return bytes }
        let path = directory + "/" + name
        let bytes: [UInt8]? = await withCheckedContinuation { continuation in
            DispatchQueue.global().async { continuation.resume(returning: FileManager.default.contents(atPath: path).map(Array.init)) }
        }
        guard let bytes else {
            throw StatsError(
                status: 404, code: "stats.no_leaflet",
                message: "\(path) is missing: install Debian's libjs-leaflet (deploy/setup does) or set stats.map.leaflet_dir", field: "stats.map.leaflet_dir")
        }
        loaded[name] = bytes
        return bytes
    }
}
