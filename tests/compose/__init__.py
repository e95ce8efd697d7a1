"""docker-compose.yml, deploy/Dockerfile and the images, checked without a Docker daemon."""
