#!/bin/sh
# skewer's Debian base image: a package's post-install never starts its daemon in an image
# build (101: action forbidden); the container's command starts what it runs.
exit 101
