# Multi-stage build: static binaries in a distroless, non-root final image.
# (No Docker engine runs on the development machines of this project; the
# image is built by CI systems that have one. `make build` builds the same
# binaries locally.)
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/idempotency-dev/idc-operator/runtime/version.Version=${VERSION}" -o /out/manager . \
 && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/idempotency-dev/idc-operator/runtime/version.Version=${VERSION}" -o /out/idc-runtime ./runtime/cmd/idc-runtime

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/manager /manager
COPY --from=build /out/idc-runtime /idc-runtime
USER 65532:65532
ENTRYPOINT ["/manager"]
