# The same image as `make image` (hack/image, built without a Docker engine:
# the development machines of this project have none), for users who have
# Docker: static binaries with the version, in a distroless, non-root image
# (65532, CA certificates, no shell). `make docker-build` passes the version.
FROM golang:1.27.3 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
ENV LDFLAGS="-w -X github.com/idempotency-dev/idc-operator/runtime/version.Version=${VERSION} -X github.com/idempotency-dev/idc-operator/runtime/version.Commit=${COMMIT}"
RUN CGO_ENABLED=0 go build -buildvcs=false -trimpath -ldflags "${LDFLAGS}" -o /out/manager ./cmd/manager \
 && CGO_ENABLED=0 go build -buildvcs=false -trimpath -ldflags "${LDFLAGS}" -o /out/idc-runtime ./cmd/idc-runtime \
 && CGO_ENABLED=0 go build -buildvcs=false -trimpath -ldflags "${LDFLAGS}" -o /out/kubectl-idc ./cmd/kubectl-idc

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/manager /manager
COPY --from=build /out/idc-runtime /idc-runtime
COPY --from=build /out/kubectl-idc /kubectl-idc
USER 65532:65532
ENTRYPOINT ["/manager"]
