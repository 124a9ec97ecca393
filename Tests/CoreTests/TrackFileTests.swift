import DrivebusKit
import DrivebusTestSupport
import Foundation
import IngestCore
import Testing

@Suite struct TrackFileTests {
    @Test func readsTheViennaGPX() throws {
        let points = try TrackFiles.read(Data(contentsOf: fixtures.appendingPathComponent("car_vienna_osm_1hz.gpx")), name: "car_vienna_osm_1hz.gpx")
        #expect(points.count == 1525)
        #expect(points.allSatisfy { $0.time != nil })
        #expect(points[0] == TrackPoint(time: date("2021-11-03T16:19:50Z"), lat: 48.1230487, lon: 16.6098346, location: "trkpt 1 (line 4)"))
        #expect(points[1].time == date("2021-11-03T16:19:51Z"))
    }

    @Test func readsTheLiverpoolCSV() throws {
        let points = try TrackFiles.read(Data(contentsOf: fixtures.appendingPathComponent("bus_liverpool_route14.csv")), name: "bus_liverpool_route14.csv")
        #expect(points.count == 1533)
        #expect(points[0] == TrackPoint(time: date("2026-01-26T15:55:12Z"), lat: 53.4471850, lon: -2.9179900, courseDeg: 58, location: "line 2"))
    }

    @Test func readsGPX10RoutesWithElevationAndSpeed() throws {
        let gpx = """
            <?xml version="1.0"?>
            <gpx version="1.0" xmlns="http://www.topografix.com/GPX/1/0"><rte>
            <rtept lat="1.5" lon="2.5"><ele>100.5</ele><time>2020-01-01T00:00:00Z</time><speed>3.5</speed><course>90</course></rtept>
            <rtept lat="1.6" lon="2.6"></rtept>
            </rte></gpx>
            """
        let points = try TrackFiles.gpx(Data(gpx.utf8))
        #expect(points.count == 2)
        #expect(points[0] == TrackPoint(time: date("2020-01-01T00:00:00Z"), lat: 1.5, lon: 2.5, altitudeM: 100.5, speedMps: 3.5, courseDeg: 90, location: "rtept 1 (line 3)"))
        #expect(points[1].time == nil)
        #expect(throws: TrackFileError.self) { try TrackFiles.gpx(Data("<gpx><trk><trkpt lat='x'".utf8)) }
    }

    @Test func readsGeoJSONPointsAndLineStrings() throws {
        let geojson = """
            {"type":"FeatureCollection","features":[
              {"type":"Feature","geometry":{"type":"Point","coordinates":[16.1,48.1,200]},"properties":{"time":"2024-05-01T10:00:00Z"}},
              {"type":"Feature","geometry":{"type":"LineString","coordinates":[[16.2,48.2],[16.3,48.3,5]]},"properties":{"coordTimes":["2024-05-01T10:00:01Z",1714557602]}}
            ]}
            """
        let points = try TrackFiles.geoJSON(Array(geojson.utf8))
        #expect(points.map(\.lat) == [48.1, 48.2, 48.3])
        #expect(points.map(\.time) == [date("2024-05-01T10:00:00Z"), date("2024-05-01T10:00:01Z"), date("2024-05-01T10:00:02Z")])
        #expect(points[0].altitudeM == 200 && points[2].altitudeM == 5)
    }

    @Test func csvErrorsNameTheLine() {
        #expect(throws: TrackFileError(location: "line 1", message: "the header needs timestamp (or time), latitude (or lat) and longitude (or lon)")) {
            try TrackFiles.csv("when,where\n1,2\n")
        }
        #expect(throws: TrackFileError(location: "line 3", message: "lat \"north\" is not a number")) {
            try TrackFiles.csv("time,lat,lon\n2024-01-01T00:00:00Z,1,2\n2024-01-01T00:00:01Z,north,2\n")
        }
    }
}
