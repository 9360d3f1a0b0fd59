"""stepmodel"""
